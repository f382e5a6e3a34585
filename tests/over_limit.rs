//! Over-long System One states (`over_limit`): cut as the reference decisio
//! 0.35.0 cuts them, character for character, on three tokenizers in both
//! prompt formats (`scripts/reference/over_limit.py`, `make reference`);
//! served cut on both backends, answered as the cut text asked whole, never
//! certified; refused with the way out named.

mod common;

use std::time::Duration;

use common::{reference_file, ReferenceTokenizer, Server};
use decisio::bases;
use decisio::http::systemone::parse_request;
use decisio::text_route::decide::{render_wire_text, Question, State};
use decisio::text_route::over_limit::fit_state;
use decisio::text_route::systemone::{layout_header, state_text, to_asked, Layout, WireSettings};
use serde_json::{json, Value};

/// The reference's cases of one tokenizer in one format, each cut by
/// decisio's [`fit_state`] with the longest row rendered by decisio's own
/// prompt builder; returns (states, cut, refused).
fn check_cuts(folder: &str, settings: &WireSettings) -> (usize, usize, usize) {
    let format = settings.format;
    let (mut states, mut cuts, mut refused) = (0, 0, 0);
    for ReferenceTokenizer {
        name,
        tokenizer,
        template,
        codes,
    } in common::reference_tokenizers(&format)
    {
        let encode = |t: &str| tokenizer.encode(t, false).map_err(|e| e.to_string());
        let decode = |ids: &[u32]| tokenizer.decode(ids, false).map_err(|e| e.to_string());
        let file = reference_file(&format!("{folder}{name}.json"));
        let entries: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        for (i, entry) in entries.iter().enumerate() {
            let request = parse_request(entry["request"].to_string().as_bytes()).unwrap();
            let asked: Vec<_> = request
                .questions
                .iter()
                .map(|(_, q)| to_asked(q, settings.noul))
                .collect();
            let empty = match format.layout {
                Layout::Plain => State::Text(String::new()),
                Layout::Header => {
                    State::Text(layout_header(asked.iter().map(|a| a.instructions.trim())))
                }
            };
            let mut overhead = 0;
            for a in &asked {
                let names: Vec<String> = codes[..a.options.len().min(255)]
                    .iter()
                    .map(|(c, _)| c.clone())
                    .collect();
                let q = Question::new(a.instructions.clone(), a.options.clone())
                    .with_wire(Some(a.ask.clone()));
                let text = render_wire_text(&template, &empty, &q, &a.ask, &names, &format);
                overhead = overhead.max(encode(&text.unwrap()).unwrap().len());
            }
            let at = format!("{folder}{name} #{i}");
            assert_eq!(
                json!(overhead),
                entry["overhead"],
                "{at}: the row without a state"
            );
            let limit = entry["limit"].as_u64().unwrap() as usize;
            let reserve = entry["reserve"].as_u64().unwrap() as usize;
            let text = state_text(&request.state);
            match fit_state(encode, decode, &text, overhead, limit, reserve) {
                Ok((kept, None)) => {
                    assert_eq!(entry["state"], Value::Null, "{at}: the reference cut it");
                    assert!(entry.get("error").is_none(), "{at}");
                    assert_eq!(kept, text, "{at}");
                }
                Ok((kept, Some(cut))) => {
                    assert_eq!(json!(kept), entry["state"], "{at}: the text kept");
                    assert_eq!(json!(cut), entry["report"], "{at}: the report");
                    cuts += 1;
                }
                Err(message) => {
                    assert_eq!(json!(message), entry["error"], "{at}: the refusal");
                    refused += 1;
                }
            }
            states += 1;
        }
    }
    (states, cuts, refused)
}

#[test]
fn states_are_cut_as_the_reference_cuts_them() {
    let (states, cuts, refused) = check_cuts("over_limit/", &WireSettings::SERVED);
    eprintln!("the Qwen format: {states} states, {cuts} cut, {refused} refused, all alike");
    assert!(cuts >= 600, "only {cuts} cuts compared");
    let gemma = bases::by_name("gemma-4-31b").unwrap().wire;
    let (states, cuts, refused) = check_cuts("over_limit/gemma/", &gemma);
    eprintln!("the Gemma format: {states} states, {cuts} cut, {refused} refused, all alike");
    assert!(cuts >= 300, "only {cuts} cuts compared");
}

const WAIT: Duration = Duration::from_secs(600);

#[test]
fn a_state_over_the_ceiling_is_cut_on_both_backends_as_the_reference_cuts_it() {
    // The fixture's MLX server and a vLLM-backend gateway in front of it,
    // each with the ceiling the reference cut these states to.
    let limit = "512";
    // No prefix cache: the kept text asked whole is computed again, not
    // read back from the cut request's state.
    let mlx = Server::start(&["--over-limit-tokens", limit, "--prefix-cache-mb", "0"]);
    let url = mlx.url();
    let mut args = common::gateway_args(&url);
    args.extend(["--over-limit-tokens", limit, "--prefix-cache-mb", "0"]);
    let gateway = Server::start(&args);
    let file = reference_file("over_limit/served-512/fixture.json");
    let entries: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let (mut cut, mut refused) = (0, 0);
    for s in [&mlx, &gateway] {
        for (i, entry) in entries.iter().enumerate() {
            let mut body = entry["request"].clone();
            body["over_limit"] = json!("truncate");
            let r = s.post_json_waiting("/v1/systemone", &body, WAIT);
            if let Some(error) = entry.get("error") {
                assert_eq!(r.status, 413, "#{i}: {}", r.text());
                assert_eq!(&r.json()["detail"]["message"], error, "#{i}");
                refused += 1;
                continue;
            }
            assert_eq!(r.status, 200, "#{i}: {}", r.text());
            let v = r.json();
            let report = &entry["report"];
            let got = &v["x_truncated"];
            for field in ["kept_tokens", "of_tokens", "part", "limit"] {
                assert_eq!(got[field], report[field], "#{i}: {field}: {v}");
            }
            let dropped =
                report["of_tokens"].as_u64().unwrap() - report["kept_tokens"].as_u64().unwrap();
            assert_eq!(got["dropped_tokens"], dropped, "#{i}");
            assert_eq!(
                r.header("x-decisio-state-truncated"),
                Some(
                    format!(
                        "kept={}; of={}; part=start",
                        report["kept_tokens"], report["of_tokens"]
                    )
                    .as_str()
                ),
                "#{i}"
            );
            // The same bits as the reference's cut text asked whole.
            let whole =
                json!({"state": entry["state"], "questions": entry["request"]["questions"]});
            let w = s.post_json_waiting("/v1/systemone", &whole, WAIT);
            assert_eq!(w.status, 200, "#{i}: {}", w.text());
            let w = w.json();
            assert!(w.get("x_truncated").is_none(), "{w}");
            assert_eq!(v["answers"], w["answers"], "#{i}");
            assert_eq!(v["usage"], w["usage"], "#{i}");
            cut += 1;
        }
    }
    assert!(cut >= 20 && refused >= 1, "{cut} cut, {refused} refused");
    assert_eq!(
        mlx.metric("decisio_states_truncated_total", ""),
        (cut / 2) as f64
    );

    // A request that says nothing takes the server's `--over-limit`; one
    // that names another mode is refused in the wire's shape; a state that
    // fits is not reported.
    let s = Server::start(&["--over-limit", "truncate", "--over-limit-tokens", limit]);
    let entry = entries.iter().find(|e| e.get("report").is_some()).unwrap();
    let v = s
        .post_json_waiting("/v1/systemone", &entry["request"], WAIT)
        .json();
    assert_eq!(
        v["x_truncated"]["kept_tokens"], entry["report"]["kept_tokens"],
        "{v}"
    );
    let mut body = entry["request"].clone();
    body["over_limit"] = json!("cut");
    let r = s.post_json("/v1/systemone", &body);
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(
        r.json()["detail"][0]["loc"],
        json!(["body", "over_limit"]),
        "{}",
        r.text()
    );
    body["over_limit"] = json!("truncate");
    body["state"] = json!("A short state.");
    let v = s.post_json("/v1/systemone", &body).json();
    assert!(v.get("x_truncated").is_none(), "{v}");
    // `refuse` refuses a state over the context (the fixture's 8,192
    // tokens; the ceiling cut to is for `truncate` alone), naming the way
    // out; `truncate` answers it.
    body["state"] = json!("word ".repeat(9_000));
    body["over_limit"] = json!("refuse");
    let r = s.post_json_waiting("/v1/systemone", &body, WAIT);
    assert_eq!(r.status, 413, "{}", r.text());
    let message = r.json()["detail"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("maximum context length is 8192 tokens")
            && message.contains("send \"over_limit\": \"truncate\""),
        "{message}"
    );
    body["over_limit"] = json!("truncate");
    let v = s.post_json_waiting("/v1/systemone", &body, WAIT).json();
    assert!(v["x_truncated"]["of_tokens"].as_u64() >= Some(9_000), "{v}");
    // A task's example may not ask for a cut.
    let mut example = entry["request"].clone();
    example["over_limit"] = json!("truncate");
    let q = example["questions"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    let one = json!({q.0.clone(): q.1.clone()});
    example["questions"] = one;
    let r = s.post_json(
        "/v1/tasks",
        &json!({"id": "cut", "examples": [{"request": example, "answer": "yes"}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("over_limit"), "{}", r.text());
}
