//! The header limit (`--header-limit`): under the header layout a request
//! whose rows would be over the prompt ceiling lists only the questions
//! that fit, planned as the reference decisio 0.35.0 plans it
//! (`scripts/reference/header_limit.py`, `make reference`): on three
//! tokenizers in the Gemma bases' format, the lines listed, the report and
//! the refusals' words alike; and served on both backends (the fixture
//! with `--layout header`), the report, the header and the input tokens the
//! reference counts.

mod common;

use std::time::Duration;

use common::{reference_file, ReferenceTokenizer, Server};
use decisio::bases;
use decisio::http::systemone::parse_request;
use decisio::settings::HeaderLimit;
use decisio::text_route::decide::{render_wire_text, render_wire_user_turn, Question, State};
use decisio::text_route::header_limit::{plan, Request};
use decisio::text_route::systemone::{layout_header, question_text, state_text, to_asked};
use serde_json::{json, Value};

/// The setting an entry was planned under.
fn setting(entry: &Value) -> HeaderLimit {
    match (entry["mode"].as_str().unwrap(), entry["cap"].as_u64()) {
        ("off", _) => HeaderLimit::Off,
        (_, cap) => HeaderLimit::Auto(cap.map(|c| c as usize)),
    }
}

#[test]
fn headers_are_limited_as_the_reference_limits_them() {
    let settings = bases::by_name("gemma-4-31b").unwrap().wire;
    let format = settings.format;
    let (mut planned, mut limited, mut refused, mut plain) = (0, 0, 0, 0);
    for ReferenceTokenizer {
        name,
        tokenizer,
        template,
        codes,
    } in common::reference_tokenizers(&format)
    {
        let count = |t: &str| -> Result<usize, String> {
            Ok(tokenizer.encode(t, false).map_err(|e| e.to_string())?.len())
        };
        let file = reference_file(&format!("header_limit/{name}.json"));
        let entries: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let template_tokens =
            count(&render_wire_user_turn(&template, "", &format).unwrap()).unwrap();
        for (i, entry) in entries.iter().enumerate() {
            let at = format!("{name} #{i}");
            let request = parse_request(entry["request"].to_string().as_bytes()).unwrap();
            let state = state_text(&request.state);
            let asked: Vec<_> = request
                .questions
                .iter()
                .map(|(_, q)| to_asked(q, settings.noul))
                .collect();
            let names =
                |n: usize| -> Vec<String> { codes[..n].iter().map(|(c, _)| c.clone()).collect() };
            let questions: Vec<Question> = asked
                .iter()
                .map(|a| {
                    Question::new(a.instructions.clone(), a.options.clone())
                        .with_wire(Some(a.ask.clone()))
                })
                .collect();
            let instructions: Vec<&str> = questions.iter().map(|q| q.text.trim()).collect();
            let longest = |k: usize| -> Result<usize, String> {
                let header = match k {
                    0 => String::new(),
                    k => layout_header(instructions[..k].iter().copied()),
                };
                let listed = State::Text(format!("{header}{state}"));
                let mut most = 0;
                for (q, a) in questions.iter().zip(&asked) {
                    let text = render_wire_text(
                        &template,
                        &listed,
                        q,
                        &a.ask,
                        &names(a.options.len()),
                        &format,
                    )
                    .map_err(|e| e.to_string())?;
                    most = most.max(count(&text)?);
                }
                Ok(most)
            };
            let texts = questions
                .iter()
                .zip(&asked)
                .map(|(q, a)| {
                    question_text(&a.ask, q.text.trim(), &q.options, &names(a.options.len()))
                })
                .collect();
            let request = Request {
                instructions: instructions.clone(),
                state: &state,
                questions: texts,
                template_tokens,
            };
            let limit = entry["limit"].as_u64().unwrap() as usize;
            let reserve = entry["reserve"].as_u64().unwrap() as usize;
            let got = plan(&count, &longest, &request, limit, reserve, setting(entry));
            let want = &entry["plan"];
            match got {
                Ok(None) => assert!(
                    want.is_null() || (want["limited"] == false && want["fits"] == true),
                    "{at}: the reference planned {want}"
                ),
                Ok(Some(report)) => {
                    assert_eq!(want["fits"], true, "{at}: {want}");
                    assert_eq!(json!(report), want["report"], "{at}");
                    limited += 1;
                    plain += usize::from(report.listed == 0);
                }
                Err(message) => {
                    assert_eq!(json!(message), want["refusal"], "{at}: the refusal");
                    refused += 1;
                }
            }
            planned += 1;
        }
    }
    eprintln!("{planned} requests: {limited} limited ({plain} to the plain row), {refused} refused, all alike");
    assert!(
        limited >= 200 && refused >= 100 && plain >= 1,
        "{limited} limited, {refused} refused, {plain} plain"
    );
}

const WAIT: Duration = Duration::from_secs(600);

#[test]
fn a_limited_header_is_served_alike_on_both_backends() {
    // The fixture in the served defaults' format with the header layout,
    // at the reference's ceiling of these requests.
    let flags = ["--layout", "header", "--over-limit-tokens", "512"];
    let mlx = Server::start(&flags);
    let url = mlx.url();
    let mut args = common::gateway_args(&url);
    args.extend(flags);
    let gateway = Server::start(&args);
    let file = reference_file("header_limit/served/fixture.json");
    let entries: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let mut limited = 0;
    for (i, entry) in entries.iter().enumerate() {
        let ask = |s: &Server| {
            let r = s.post_json_waiting("/v1/systemone", &entry["request"], WAIT);
            assert_eq!(r.status, 200, "#{i}: {}", r.text());
            (r.header("x-decisio-layout").map(str::to_string), r.json())
        };
        // The two servers are asked side by side.
        let ((la, a), (lb, b)) = std::thread::scope(|scope| {
            let on_gateway = scope.spawn(|| ask(&gateway));
            (ask(&mlx), on_gateway.join().unwrap())
        });
        assert_eq!(
            a["usage"]["input_tokens"], entry["input_tokens"],
            "#{i}: {a}"
        );
        assert_eq!(a["usage"], b["usage"], "#{i}");
        assert_eq!(la, lb, "#{i}");
        let plan = &entry["plan"];
        if plan.is_null() || plan["limited"] == false {
            assert!(a.get("x_header_limited").is_none(), "#{i}: {a}");
            assert!(la.is_none(), "#{i}");
        } else {
            let report = &plan["report"];
            assert_eq!(a["x_header_limited"], *report, "#{i}");
            assert_eq!(b["x_header_limited"], *report, "#{i}");
            assert_eq!(
                la.as_deref(),
                Some(
                    format!(
                        "{}; listed={}; of={}; reason={}",
                        report["layout"].as_str().unwrap(),
                        report["listed"],
                        report["of"],
                        report["reason"].as_str().unwrap()
                    )
                    .as_str()
                ),
                "#{i}"
            );
            limited += 1;
        }
        for (id, x) in a["answers"].as_object().unwrap() {
            let y = &b["answers"][id];
            let pairs: Vec<(f64, f64)> = match x["probabilities"].as_object() {
                Some(p) => p
                    .iter()
                    .map(|(k, v)| (v.as_f64().unwrap(), y["probabilities"][k].as_f64().unwrap()))
                    .collect(),
                None => vec![(x["noul"].as_f64().unwrap(), y["noul"].as_f64().unwrap())],
            };
            for (p, q) in pairs {
                assert!((p - q).abs() < 1e-5, "#{i} {id}: {x} vs {y}");
            }
        }
    }
    assert!(limited >= 8, "{limited} limited");
    assert_eq!(
        mlx.metric("decisio_headers_limited_total", ""),
        limited as f64
    );

    // Off: the same request over the ceiling is refused, naming the way
    // out; one whose rows fit is not touched.
    let off = Server::start(&[
        "--layout",
        "header",
        "--over-limit-tokens",
        "512",
        "--header-limit",
        "off",
    ]);
    let entry = entries
        .iter()
        .find(|e| e["plan"]["limited"] == true)
        .unwrap();
    let r = off.post_json_waiting("/v1/systemone", &entry["request"], WAIT);
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(
        r.text()
            .contains("start the server with --header-limit auto"),
        "{}",
        r.text()
    );
}
