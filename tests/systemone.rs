//! `POST /v1/systemone` (TypeSafe's System One wire): answered by a real
//! server on the fixture, refused in the wire's own shapes, and its prompts
//! checked token for token against the reference decisio 0.35.0's own
//! builders (`scripts/reference/systemone_prompts.py`, `make reference`).

mod common;

use common::{model_dir, reference_file, ReferenceTokenizer, Response, Server};
use decisio::bases;
use decisio::http::systemone::parse_request;
use decisio::prompt::TextTokenizer;
use decisio::text_route::decide::{render_wire, Question, State};
use decisio::text_route::systemone::{
    label_forms, layout_header, question_text, split_ids, state_text, to_asked, LabelVariants,
    Layout, NoulRendering, PromptFormat, WireAsk, WireSettings, YES_NO_LABELS,
};
use serde_json::{json, Value};
use std::time::Duration;

const TICKET: &str = "I was charged twice for March and I want my money back now, or I \
                      will dispute the charge with my bank.";

fn questions() -> Value {
    json!({
        "refund": {"type": "noul", "instructions": "Does the customer want a refund?",
                   "criteria": {"true": "They ask for money back"}},
        "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
                 "criteria": {"Billing": "Payments and refunds", "Technical": null, "Sales": null}},
        "anger": {"type": "score", "instructions": "How frustrated is the customer?",
                  "criteria": ["Calm", "Frustrated", "Very angry"]},
    })
}

fn ask(s: &Server, body: &Value) -> Value {
    // Up to 10 minutes: 255 long criteria take a loaded machine past a
    // test's default read timeout of 2 minutes.
    let r = s.post_json_waiting("/v1/systemone", body, Duration::from_secs(600));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// The wire's error body: `{"detail": {"error_type", "message"}}`.
fn wire_error(r: &Response, status: u16) -> String {
    assert_eq!(r.status, status, "{}", r.text());
    let body = r.json();
    let d = &body["detail"];
    assert!(
        d["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    d["error_type"].as_str().expect("error_type").to_string()
}

/// A 422's `detail` list, each entry with `loc`, `msg` and `type`.
fn invalid(s: &Server, body: &[u8]) -> Vec<Value> {
    let r = s.request("POST", "/v1/systemone", &[], Some(body)).unwrap();
    assert_eq!(r.status, 422, "{}", r.text());
    let detail = r.json()["detail"].as_array().expect("detail[]").clone();
    for d in &detail {
        assert!(
            d["loc"].is_array() && d["msg"].is_string() && d["type"].is_string(),
            "{d}"
        );
    }
    detail
}

fn probabilities(answer: &Value) -> Vec<(String, f64)> {
    answer["probabilities"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
        .collect()
}

#[test]
fn the_wire_is_answered_whatever_else_a_request_asks() {
    let s = Server::start(&[]);
    let all = ask(
        &s,
        &json!({"model": "jev-latest", "state": TICKET, "questions": questions(),
                              "x_trace": "ignored"}),
    );
    assert_eq!(all["model"], "jev-latest");
    assert_eq!(all["usage"]["output_tokens"], 3);
    assert!(all["usage"]["input_tokens"].as_u64().unwrap() > 30);
    // The state's count is remembered by its text: asked again, the same
    // usage; another state, its own count (the tokenizer's, read here).
    let again = ask(&s, &json!({"state": TICKET, "questions": questions()}));
    assert_eq!(again["usage"], all["usage"]);
    let longer = format!("{TICKET} Thanks.");
    let other = ask(&s, &json!({"state": longer, "questions": questions()}));
    let tokenizer = TextTokenizer::from_file(model_dir().join("tokenizer.json")).unwrap();
    let count = |t: &str| tokenizer.encode(t, false).unwrap().len() as i64;
    let used = |v: &Value| v["usage"]["input_tokens"].as_i64().unwrap();
    assert_eq!(
        used(&other) - used(&all),
        count(&longer) - count(TICKET),
        "{other}"
    );
    let answers = all["answers"].as_object().unwrap();
    assert_eq!(
        answers.keys().collect::<Vec<_>>(),
        ["refund", "team", "anger"]
    );

    let noul = answers["refund"]["noul"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&noul));

    let team = &answers["team"];
    let p = probabilities(team);
    assert_eq!(
        p.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["Billing", "Technical", "Sales"]
    );
    assert!((p.iter().map(|(_, v)| v).sum::<f64>() - 1.0).abs() < 1e-12);
    let top = p
        .iter()
        .cloned()
        .fold(("".to_string(), -1.0), |a, b| if b.1 > a.1 { b } else { a });
    assert_eq!(team["choice"], top.0.as_str());
    let confidence = (top.1 - 1.0 / 3.0) / (1.0 - 1.0 / 3.0);
    assert!((team["confidence"].as_f64().unwrap() - confidence).abs() < 1e-12);

    let anger = &answers["anger"];
    let p = probabilities(anger);
    assert_eq!(
        p.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["0", "1", "2"]
    );
    let expectation: f64 = p.iter().enumerate().map(|(i, (_, v))| i as f64 * v).sum();
    assert!((anger["score"].as_f64().unwrap() - expectation).abs() < 1e-12);
    assert_eq!(
        anger["legend"],
        json!({"0": "Calm", "1": "Frustrated", "2": "Very angry"})
    );
    let c = anger["confidence"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&c), "{c}");

    // Each question alone, renamed, and in another order: the same bits,
    // computed again on a server without a prefix cache (no answer read
    // back from the state the first request kept).
    let qs = questions();
    let fresh = Server::start(&["--prefix-cache-mb", "0"]);
    for id in ["refund", "team", "anger"] {
        let alone = ask(
            &fresh,
            &json!({"state": TICKET, "questions": {format!("renamed {id} 🎯"): qs[id]}}),
        );
        let got = alone["answers"]
            .as_object()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .clone();
        assert_eq!(got, answers[id], "{id} asked alone");
    }
    let order = json!({"state": TICKET, "questions":
        {"c": qs["anger"], "a": qs["team"], "b": qs["refund"]}});
    let reordered = ask(&fresh, &order);
    assert_eq!(reordered["x_state"]["cached"], false);
    assert_eq!(reordered["answers"]["c"], answers["anger"]);
    assert_eq!(reordered["answers"]["a"], answers["team"]);
    assert_eq!(reordered["answers"]["b"], answers["refund"]);
    assert_eq!(ask(&s, &order)["x_state"]["cached"], true);

    // 255 options, lettered past Z; object and array states.
    let many: serde_json::Map<String, Value> = (0..255)
        .map(|i| {
            (
                format!("Queue {i:03}"),
                json!(format!("Tickets routed to queue {i}")),
            )
        })
        .collect();
    let wide = ask(
        &s,
        &json!({"state": {"subject": "Charged twice", "body": TICKET, "_id": 7},
                               "questions": {"queue": {"type": "choice", "criteria": many}}}),
    );
    assert_eq!(probabilities(&wide["answers"]["queue"]).len(), 255);
    let listed = ask(
        &s,
        &json!({"state": ["Charged twice.", "Refund promised."], "questions":
        {"q": {"type": "noul", "instructions": {"task": "refund?", "include": ["chargebacks"]}}}}),
    );
    assert!(listed["answers"]["q"]["noul"].is_number());

    // Both SDKs' model lists in one answer.
    let models = s.request("GET", "/v1/models", &[], None).unwrap().json();
    assert_eq!(models["object"], "list");
    let names: Vec<&str> = models["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"jev-latest"), "{models}");
    for m in models["models"].as_array().unwrap() {
        let date = m["release_date"].as_str().unwrap();
        assert!(date.len() == 10 && date.as_bytes()[4] == b'-', "{date}");
    }
}

#[test]
fn bad_requests_are_refused_in_the_wires_shape() {
    let s = Server::start(&[]);
    let d = invalid(
        &s,
        br#"{"model": "jev-latest", "state": "x", "questions": {"#,
    );
    assert_eq!(d[0]["type"], "json_invalid");
    let d = invalid(&s, br#"{"questions": {}}"#);
    assert_eq!(
        (d[0]["loc"].clone(), d[0]["type"].clone()),
        (json!(["body", "state"]), json!("missing"))
    );
    assert_eq!(d[1]["type"], "too_short");
    let q = |q: Value| {
        json!({"state": "x", "questions": {"q": q}})
            .to_string()
            .into_bytes()
    };
    let d = invalid(&s, &q(json!({"type": "boolean"})));
    assert_eq!(d[0]["type"], "union_tag_invalid");
    let d = invalid(
        &s,
        &q(json!({"type": "score", "criteria": {"0": "calm", "1": "angry"}})),
    );
    assert_eq!(d[0]["type"], "list_type");
    assert_eq!(
        d[0]["loc"],
        json!(["body", "questions", "q", "score", "criteria"])
    );
    for bad in [
        json!({"type": "choice", "criteria": {"only": null}}),
        json!({"type": "choice", "criteria": {}}),
        json!({"type": "score", "criteria": ["calm"]}),
        json!({"type": "score", "criteria": (0..11).collect::<Vec<_>>()}),
        json!({"type": "score", "criteria": ["calm", null]}),
        json!({"type": "noul", "criteria": "yes"}),
    ] {
        invalid(&s, &q(bad));
    }
    let too_many: serde_json::Map<String, Value> =
        (0..256).map(|i| (format!("o{i}"), Value::Null)).collect();
    invalid(&s, &q(json!({"type": "choice", "criteria": too_many})));
    invalid(
        &s,
        br#"{"state": null, "questions": {"q": {"type": "noul"}}}"#,
    );

    let r = s.post_json(
        "/v1/systemone",
        &json!({"model": "no-such-model", "state": "x",
                                                   "questions": {"q": {"type": "noul"}}}),
    );
    assert_eq!(wire_error(&r, 404), "not_found_error");
    let r = s.request("GET", "/v1/systemone", &[], None).unwrap();
    assert_eq!(r.status, 405);
}

#[test]
fn an_api_key_is_asked_for_in_the_wires_shape() {
    let s = Server::start(&["--api-key", "sekret"]);
    let body = json!({"state": TICKET, "questions": {"q": {"type": "noul"}}}).to_string();
    let r = s
        .request("POST", "/v1/systemone", &[], Some(body.as_bytes()))
        .unwrap();
    assert_eq!(wire_error(&r, 401), "authentication_error");
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    let wrong = [("Authorization", "Bearer nope")];
    let r = s
        .request("POST", "/v1/systemone", &wrong, Some(body.as_bytes()))
        .unwrap();
    assert_eq!(wire_error(&r, 401), "authentication_error");
    let right = [("Authorization", "Bearer sekret")];
    let r = s
        .request("POST", "/v1/systemone", &right, Some(body.as_bytes()))
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Builds decisio's System One prompts for the reference's requests in
/// `folder` (`systemone/` for the Qwen format, `systemone/gemma/` for the
/// Gemma bases') under `settings`, and compares them with the reference
/// decisio's id for id: the state's prefix, each question's ids, its label
/// ids (every form of a label under summed forms) and `usage.input_tokens`.
/// Returns the requests and questions compared.
fn check_reference_prompts(folder: &str, settings: &WireSettings) -> (usize, usize) {
    let format = settings.format;
    let (mut requests, mut questions) = (0, 0);
    for ReferenceTokenizer {
        name,
        tokenizer,
        template,
        codes,
    } in common::reference_tokenizers(&format)
    {
        let encode = |text: &str| tokenizer.encode(text, false).unwrap();
        assert_eq!(codes.len(), 255, "{name}: letter codes");
        let file = reference_file(&format!("{folder}{name}.json"));
        let entries: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let mut asked_of = std::collections::BTreeMap::<String, usize>::new();
        for entry in &entries {
            let request = parse_request(entry["request"].to_string().as_bytes()).unwrap();
            let text = state_text(&request.state);
            let asked: Vec<_> = request
                .questions
                .iter()
                .map(|(_, q)| to_asked(q, settings.noul))
                .collect();
            let mut counted = encode(&text).len();
            let state = match format.layout {
                Layout::Plain => State::Text(text.clone()),
                Layout::Header => {
                    let header = layout_header(asked.iter().map(|a| a.instructions.trim()));
                    counted += encode(&header).len();
                    State::Text(format!("{header}{text}"))
                }
            };
            for ((id, q), asked) in request.questions.iter().zip(&asked) {
                let want = &entry["questions"][id];
                assert_eq!(json!(asked.keys), want["keys"], "{name} {id}");
                let n = asked.options.len();
                let names: Vec<String> =
                    codes[..n.min(255)].iter().map(|(c, _)| c.clone()).collect();
                let question = Question {
                    id: Some(id.clone()),
                    text: asked.instructions.clone(),
                    options: asked.options.clone(),
                    abstain_below: None,
                    temperature: None,
                    head: None,
                    wire: Some(asked.ask.clone()),
                    bias: None,
                    listed: true,
                };
                let r =
                    render_wire(&template, &state, &question, &asked.ask, &names, &format).unwrap();
                let (mut ids, own) = split_ids(&tokenizer, &r.prefix, &r.suffix).unwrap();
                assert_eq!(
                    json!(ids.len()),
                    want["prefix"],
                    "{name} {id}: the state's prefix"
                );
                ids.extend(own);
                assert_eq!(
                    json!(ids),
                    want["ids"],
                    "{name} {id}: prompt ids\n{}{}",
                    r.prefix,
                    r.suffix
                );
                let labels: Vec<String> = match asked.ask {
                    WireAsk::Letters => names.clone(),
                    WireAsk::YesNoWords => YES_NO_LABELS.iter().map(|l| l.trim().into()).collect(),
                };
                let forms: Vec<Vec<u32>> = labels
                    .iter()
                    .map(|l| label_forms(&tokenizer, l, &format).unwrap())
                    .collect();
                let got = match format.variants {
                    LabelVariants::Single => json!(forms.concat()),
                    LabelVariants::Summed => json!(forms),
                };
                assert_eq!(got, want["labels"], "{name} {id}: label ids");
                counted += encode(&question_text(
                    &asked.ask,
                    &asked.instructions,
                    &asked.options,
                    &names,
                ))
                .len();
                *asked_of.entry(q.kind.as_str().to_string()).or_default() += 1;
                questions += 1;
            }
            assert_eq!(
                json!(counted),
                entry["input_tokens"],
                "{name}: usage.input_tokens"
            );
            requests += 1;
        }
        for kind in ["noul", "choice", "score"] {
            assert!(
                asked_of[kind] >= 200,
                "{name}: only {} {kind} questions",
                asked_of[kind]
            );
        }
    }
    (requests, questions)
}

#[test]
fn prompts_are_the_reference_decisios_token_for_token() {
    let (requests, questions) = check_reference_prompts("systemone/", &WireSettings::SERVED);
    eprintln!("the Qwen format: {requests} requests, {questions} questions alike");
}

#[test]
fn gemma_prompts_are_the_reference_decisios_token_for_token() {
    // The Gemma bases' format (a system turn, the template's answer slot,
    // every form of a label summed, the header layout), on the Gemma
    // tokenizer and, as further templates, the fixture's and Qwen3's.
    for base in ["gemma-4-12b", "gemma-4-31b"] {
        let settings = bases::by_name(base).unwrap().wire;
        assert_eq!(settings.format, PromptFormat::GEMMA, "{base}");
        assert_eq!(settings.noul, NoulRendering::Letters, "{base}");
    }
    let settings = bases::by_name("gemma-4-31b").unwrap().wire;
    let (requests, questions) = check_reference_prompts("systemone/gemma/", &settings);
    eprintln!("the Gemma format: {requests} requests, {questions} questions alike");
}

/// The fixture's MLX server and a vLLM-backend gateway in front of it
/// (which speaks vLLM's API), both with the default padding (none for a
/// model outside the bases) so that both read the same prompt, both started
/// with `flags`.
fn mlx_and_gateway(flags: &[&str]) -> (Server, Server) {
    let mlx = Server::start(flags);
    let url = mlx.url();
    let mut args = common::gateway_args(&url);
    args.extend(flags);
    let gateway = Server::start(&args);
    (mlx, gateway)
}

#[test]
fn a_request_over_the_context_is_refused_413_on_both_backends() {
    // The fixture's context is 8,192 tokens. A 2 MB state with 256
    // questions is refused from its length alone, before anything is
    // rendered or tokenized (the message gives its bytes); a 45 kB state
    // of 9,000 ` word` tokens passes that bound and is refused once
    // tokenized, with its count. Each is System One's 413
    // `request_too_large`, which a client does not retry, and the server
    // answers on.
    let (mlx, gateway) = mlx_and_gateway(&[]);
    let many: serde_json::Map<String, Value> = (0..256)
        .map(|i| {
            (
                format!("q{i}"),
                json!({"type": "noul", "instructions": format!("Is it {i}?")}),
            )
        })
        .collect();
    for s in [&mlx, &gateway] {
        let huge = json!({"state": "word ".repeat(400_000), "questions": many});
        let r = s.post_json_waiting("/v1/systemone", &huge, Duration::from_secs(600));
        assert_eq!(wire_error(&r, 413), "request_too_large");
        let message = r.json()["detail"]["message"].as_str().unwrap().to_string();
        assert!(
            message.contains("maximum context length is 8192 tokens")
                && message.contains("the state is 2000000 bytes"),
            "{message}"
        );
        let over = json!({"state": "word ".repeat(9_000), "questions": questions()});
        let r = s.post_json_waiting("/v1/systemone", &over, Duration::from_secs(600));
        assert_eq!(wire_error(&r, 413), "request_too_large");
        let message = r.json()["detail"]["message"].as_str().unwrap().to_string();
        assert!(
            message.contains("maximum context length is 8192 tokens")
                && message.contains("the state and a question take"),
            "{message}"
        );
        let fits = ask(s, &json!({"state": TICKET, "questions": questions()}));
        assert_eq!(fits["answers"].as_object().unwrap().len(), 3);
    }
}

#[test]
fn the_vllm_backend_answers_the_wire_as_the_mlx_backend_does() {
    // The gateway in front of the MLX server (which speaks vLLM's API),
    // unpadded so that both read the same prompt: the same answers, up to
    // the log-probabilities' trip through JSON. The 255 options' letter
    // codes are read in two requests (vLLM takes 128 ids a request).
    let (mlx, gateway) = mlx_and_gateway(&[]);
    let mut qs = questions();
    let many: serde_json::Map<String, Value> = (0..255)
        .map(|i| {
            (
                format!("Queue {i:03}"),
                json!(format!("Tickets routed to queue {i}")),
            )
        })
        .collect();
    qs["queue"] = json!({"type": "choice", "instructions": "Which queue?", "criteria": many});
    let body = json!({"state": TICKET, "questions": qs});
    let (a, b) = (ask(&mlx, &body), ask(&gateway, &body));
    for id in ["refund", "team", "anger", "queue"] {
        let (x, y) = (&a["answers"][id], &b["answers"][id]);
        assert_eq!(x["type"], y["type"], "{id}");
        assert_eq!(x["choice"], y["choice"], "{id}");
        let values = |v: &Value| -> Vec<f64> {
            match v.get("probabilities") {
                Some(_) => probabilities(v).into_iter().map(|(_, p)| p).collect(),
                None => vec![v["noul"].as_f64().unwrap()],
            }
        };
        for (p, q) in values(x).iter().zip(values(y)) {
            assert!(
                (p - q).abs() < 1e-5,
                "{id}: {p} on MLX, {q} through the vLLM backend"
            );
        }
    }
    assert_eq!(
        b["answers"]["queue"]["probabilities"]
            .as_object()
            .unwrap()
            .len(),
        255
    );
    // `/v1/decide` letters 255 options too (`AA`, `AB`, ... past `Z`), on
    // both backends alike.
    let options: Vec<String> = (0..255).map(|i| format!("queue {i}")).collect();
    let decide = json!({"state": TICKET, "questions": [
        {"text": "Which queue should take this ticket?", "options": options}]});
    let answer = |s: &Server| {
        let r = s.post_json("/v1/decide", &decide);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["answers"][0].clone()
    };
    let (x, y) = (answer(&mlx), answer(&gateway));
    assert_eq!(x["letter"], y["letter"]);
    let (px, py) = (
        x["probabilities"].as_object().unwrap(),
        y["probabilities"].as_object().unwrap(),
    );
    assert_eq!(px.len(), 255);
    assert!(px.keys().eq(py.keys()));
    for (k, p) in px {
        let q = py[k].as_f64().unwrap();
        assert!((p.as_f64().unwrap() - q).abs() < 1e-5, "{k}: {p} and {q}");
    }
}

/// The serve flags that put System One questions in the Gemma bases'
/// format on a model of no base (the fixture).
const GEMMA_FORMAT: [&str; 10] = [
    "--system-prompt",
    "true",
    "--answer-slot",
    "template",
    "--label-variants",
    "summed",
    "--layout",
    "header",
    "--noul-rendering",
    "letters",
];

/// Each label's probability after `ids`, from the MLX server's completions:
/// the log-probabilities of every form (`logprob_token_ids`, 128 ids a
/// request), summed per label (log-sum-exp), divided by `temperature`,
/// normalised.
fn summed_reference(s: &Server, ids: &Value, forms: &[Vec<u32>], temperature: f64) -> Vec<f64> {
    let flat = forms.concat();
    let mut lp = std::collections::HashMap::new();
    for chunk in flat.chunks(128) {
        let r = s.post_json(
            "/v1/completions",
            &json!({"prompt": ids, "max_tokens": 1, "logprobs": 1, "logprob_token_ids": chunk,
                    "return_tokens_as_token_ids": true}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let top = r.json()["choices"][0]["logprobs"]["top_logprobs"][0].clone();
        for (name, v) in top.as_object().unwrap() {
            let id: u32 = name.strip_prefix("token_id:").unwrap().parse().unwrap();
            lp.insert(id, v.as_f64().unwrap());
        }
    }
    let label: Vec<f64> = forms
        .iter()
        .map(|g| {
            let v: Vec<f64> = g.iter().map(|t| lp[t]).collect();
            let top = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (top + v.iter().map(|x| (x - top).exp()).sum::<f64>().ln()) / temperature
        })
        .collect();
    let top = label.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = label.iter().map(|x| (x - top).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

#[test]
fn the_gemma_format_sums_every_form_of_a_label_on_both_backends() {
    // The fixture served in the Gemma bases' format, directly and through
    // the vLLM backend: each answer is the reference decisio's prompt (its
    // own ids and label forms, `systemone/gemma/fixture.json`) read through
    // completions, every form of a label summed. A question of more than
    // 128 forms (a 255-option choice reads 510) is read by the vLLM backend
    // in several requests of at most 128 ids on the same prompt.
    let (mlx, gateway) = mlx_and_gateway(&GEMMA_FORMAT);
    let entries: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(reference_file("systemone/gemma/fixture.json")).unwrap(),
    )
    .unwrap();
    let forms_of =
        |want: &Value| -> Vec<Vec<u32>> { serde_json::from_value(want["labels"].clone()).unwrap() };
    let many = |e: &Value| {
        e["questions"]
            .as_object()
            .unwrap()
            .values()
            .any(|q| forms_of(q).concat().len() > 128)
    };
    let size = |e: &Value| -> usize {
        e["questions"]
            .as_object()
            .unwrap()
            .values()
            .map(|q| q["ids"].as_array().unwrap().len())
            .sum()
    };
    // The CPU reads a few short requests quickly: the first three under a
    // thousand prompt tokens, and the shortest past 128 forms.
    let mut chosen: Vec<&Value> = entries
        .iter()
        .filter(|e| !many(e) && size(e) < 1000)
        .take(3)
        .collect();
    chosen.extend(entries.iter().filter(|e| many(e)).min_by_key(|e| size(e)));
    let (mut compared, mut past_128) = (0, 0);
    for entry in chosen {
        let body = &entry["request"];
        let (a, b) = (ask(&mlx, body), ask(&gateway, body));
        for (id, want) in entry["questions"].as_object().unwrap() {
            let forms = forms_of(want);
            assert!(forms.iter().any(|g| g.len() > 1), "{id}: one form a label");
            let answer = &a["answers"][id];
            let temperature = answer["x_temperature"].as_f64().unwrap();
            let expected = summed_reference(&mlx, &want["ids"], &forms, temperature);
            let keys: Vec<String> = serde_json::from_value(want["keys"].clone()).unwrap();
            for (backend, got) in [("MLX", answer), ("vLLM backend", &b["answers"][id])] {
                let values: Vec<f64> = match got.get("probabilities") {
                    Some(p) => p
                        .as_object()
                        .unwrap()
                        .values()
                        .map(|v| v.as_f64().unwrap())
                        .collect(),
                    None => {
                        let yes = keys.iter().position(|k| k == "yes").unwrap();
                        let noul = got["noul"].as_f64().unwrap();
                        let mut v = vec![1.0 - noul; 2];
                        v[yes] = noul;
                        v
                    }
                };
                assert_eq!(values.len(), expected.len(), "{id} on {backend}");
                for (p, q) in values.iter().zip(&expected) {
                    assert!(
                        (p - q).abs() < 1e-5,
                        "{id} on {backend}: {p}, summed forms {q}"
                    );
                }
            }
            compared += 1;
            past_128 += usize::from(forms.concat().len() > 128);
        }
    }
    assert!(past_128 >= 1, "{past_128} questions past 128 forms");
    eprintln!("{compared} questions alike on both backends, {past_128} of them past 128 forms");
}

#[test]
fn x_orders_averages_the_cyclic_orders_of_the_options_on_both_backends() {
    // In the Gemma format (its header lists the request's questions, so the
    // orders must not list the question again, and every form of a letter
    // is summed): `x_orders: 5` on five options is the normalised geometric
    // mean of the five rotations, each asked alone in its own request.
    let (mlx, gateway) = mlx_and_gateway(&GEMMA_FORMAT);
    let keys = ["Billing", "Technical", "Sales", "Legal", "Shipping"];
    let asked = |order: &[usize], orders: Option<usize>| {
        let criteria: serde_json::Map<String, Value> = order
            .iter()
            .map(|&i| (keys[i].to_string(), Value::Null))
            .collect();
        let mut body = json!({"state": TICKET, "questions": {
            "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
                     "criteria": criteria},
            "refund": {"type": "noul", "instructions": "Does the customer want a refund?"}}});
        if let Some(k) = orders {
            body["x_orders"] = json!(k);
        }
        body
    };
    let identity = [0, 1, 2, 3, 4];
    let averaged = ask(&mlx, &asked(&identity, Some(5)));
    let team = &averaged["answers"]["team"];
    assert_eq!(team["x_orders"], 5, "{team}");
    // A yes/no question asked as two lettered options is read in both.
    assert_eq!(averaged["answers"]["refund"]["x_orders"], 2, "{averaged}");
    let mut mean = [0.0f64; 5];
    for r in 0..5 {
        let order = decisio::text_route::decide::rotation(5, r, 5);
        let one = ask(&mlx, &asked(&order, None));
        for (k, p) in probabilities(&one["answers"]["team"]) {
            let i = keys.iter().position(|&key| key == k).unwrap();
            mean[i] += p.ln() / 5.0;
        }
    }
    let total: f64 = mean.iter().map(|v| v.exp()).sum();
    let got = probabilities(team);
    let names: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, keys, "keyed in the order sent");
    for (i, (_, p)) in got.iter().enumerate() {
        // The average is kept in float32, as the letters' logits are.
        let want = mean[i].exp() / total;
        assert!((p - want).abs() < 1e-6, "{}: {p} vs {want}", keys[i]);
    }
    // One order is the question asked once, bit for bit.
    let once = ask(&mlx, &asked(&identity, Some(1)));
    let plain = ask(&mlx, &asked(&identity, None));
    assert_eq!(once["answers"]["team"]["x_orders"], 1);
    assert_eq!(
        once["answers"]["team"]["probabilities"],
        plain["answers"]["team"]["probabilities"]
    );
    // The vLLM backend averages alike.
    let through = ask(&gateway, &asked(&identity, Some(5)));
    for ((k, p), (_, q)) in got.iter().zip(probabilities(&through["answers"]["team"])) {
        assert!(
            (p - q).abs() < 1e-5,
            "{k}: {p} on MLX, {q} through the vLLM backend"
        );
    }
    // /v1/decide takes it too; out of range or over the request's questions
    // is refused in each route's shape.
    let decide = |orders: Value, n: usize| {
        let q = json!({"text": "Which team should handle this ticket?",
                       "options": ["billing", "technical", "sales"]});
        mlx.post_json(
            "/v1/decide",
            &json!({"state": TICKET, "questions": vec![q; n], "x_orders": orders}),
        )
    };
    // An integral float is an integer, as JSON Schema reads it.
    let r = decide(json!(3.0), 2);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["answers"][1]["x_orders"], 3);
    for (orders, n) in [
        (json!(0), 1),
        (json!(-1), 1),
        (json!(256), 1),
        (json!(3), 100),
    ] {
        let r = decide(orders.clone(), n);
        assert_eq!(r.status, 400, "{orders} x {n}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], "x_orders", "{}", r.text());
    }
    for bad in [json!(0), json!("2"), json!(1.5)] {
        let mut body = asked(&identity, None);
        body["x_orders"] = bad.clone();
        let detail = invalid(&mlx, body.to_string().as_bytes());
        assert_eq!(
            detail[0]["loc"],
            json!(["body", "x_orders"]),
            "{bad}: {detail:?}"
        );
    }
}
