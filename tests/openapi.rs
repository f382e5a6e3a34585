//! `openapi/openapi.yaml` describes exactly the routes the server has
//! (`decisio::http::ROUTES`), and the parts every client relies on.

use std::collections::BTreeSet;

use serde_yaml_ng::Value;

/// The keys of an OpenAPI path item that are operations.
const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

const SPEC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.yaml");

fn spec() -> Value {
    let text = std::fs::read_to_string(SPEC).unwrap_or_else(|e| panic!("cannot read {SPEC}: {e}"));
    let spec: Value =
        serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{SPEC} is not valid YAML: {e}"));
    let version = spec
        .get("openapi")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(
        version.starts_with("3.1."),
        "{SPEC}: `openapi` is `{version}`; expected 3.1.x"
    );
    spec
}

/// Every operation as (METHOD, path, operation).
fn operations(spec: &Value) -> Vec<(String, String, &Value)> {
    let paths = spec
        .get("paths")
        .and_then(Value::as_mapping)
        .unwrap_or_else(|| panic!("{SPEC}: `paths` is missing or not a mapping"));
    let mut ops = Vec::new();
    for (path, item) in paths {
        let path = path
            .as_str()
            .unwrap_or_else(|| panic!("{SPEC}: a path key is not a string: {path:?}"));
        let item = item
            .as_mapping()
            .unwrap_or_else(|| panic!("{SPEC}: the path item of {path} is not a mapping"));
        for (key, op) in item {
            if let Some(method) = key.as_str().filter(|k| METHODS.contains(k)) {
                ops.push((method.to_uppercase(), path.to_string(), op));
            }
        }
    }
    ops
}

#[test]
fn spec_routes_are_exactly_the_server_routes() {
    let spec = spec();
    let documented: BTreeSet<(String, String)> = operations(&spec)
        .into_iter()
        .map(|(method, path, _)| (method, path))
        .collect();
    let served: BTreeSet<(String, String)> = decisio::http::ROUTES
        .iter()
        .map(|e| (e.method.to_string(), e.path.to_string()))
        .collect();
    assert_eq!(
        served.len(),
        decisio::http::ROUTES.len(),
        "http::ROUTES lists a route twice"
    );
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let not_served: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty() && not_served.is_empty(),
        "{SPEC} and http::ROUTES differ:\n  served but not documented: {undocumented:?}\n  \
         documented but not served: {not_served:?}"
    );
}

#[test]
fn every_operation_with_a_body_declares_a_400() {
    let spec = spec();
    for (method, path, op) in operations(&spec) {
        if op.get("requestBody").is_none() {
            continue;
        }
        let responses = op
            .get("responses")
            .and_then(Value::as_mapping)
            .unwrap_or_else(|| panic!("{method} {path}: no `responses`"));
        // A status key may be written "400" or 400.
        let has_400 = responses
            .keys()
            .any(|k| k.as_str() == Some("400") || k.as_u64() == Some(400));
        assert!(has_400, "{method} {path} does not declare a 400 response");
    }
}

#[test]
fn the_error_schema_is_declared() {
    let spec = spec();
    let error = spec
        .get("components")
        .and_then(|c| c.get("schemas"))
        .and_then(|s| s.get("Error"))
        .unwrap_or_else(|| panic!("{SPEC}: components.schemas.Error is missing"));
    let detail = error
        .get("properties")
        .and_then(|p| p.get("error"))
        .and_then(|e| e.get("properties"))
        .and_then(Value::as_mapping)
        .unwrap_or_else(|| panic!("{SPEC}: Error has no `error` object with properties"));
    for field in ["message", "type", "param", "code"] {
        assert!(
            detail.keys().any(|k| k.as_str() == Some(field)),
            "{SPEC}: Error.error has no `{field}`"
        );
    }
}

/// The field names a request type's `Deserialize` reads, as serde's derive
/// passes them to `deserialize_struct`: the type's own list, so a field
/// added to the code and not to the description (or the other way) fails.
fn fields_of<T: serde::de::DeserializeOwned>() -> BTreeSet<String> {
    use serde::de::{self, Visitor};
    use std::cell::RefCell;

    thread_local!(static SEEN: RefCell<Option<&'static [&'static str]>> = const { RefCell::new(None) });

    struct Capture;
    impl<'de> de::Deserializer<'de> for Capture {
        type Error = de::value::Error;
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            SEEN.with(|s| *s.borrow_mut() = Some(fields));
            Err(de::Error::custom("captured"))
        }
        fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    SEEN.with(|s| *s.borrow_mut() = None);
    let _ = T::deserialize(Capture);
    let fields = SEEN
        .with(|s| *s.borrow())
        .unwrap_or_else(|| panic!("{} is not a struct", std::any::type_name::<T>()));
    fields.iter().map(|f| f.to_string()).collect()
}

/// The property names of the schema at `pointer` (a JSON pointer into
/// the description, `$ref`s followed).
fn properties_at(spec: &serde_json::Value, pointer: &str) -> BTreeSet<String> {
    let mut schema = spec
        .pointer(pointer)
        .unwrap_or_else(|| panic!("{SPEC}: no {pointer}"));
    while let Some(r) = schema.get("$ref").and_then(|r| r.as_str()) {
        schema = spec
            .pointer(r.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("{SPEC}: {pointer} refers to {r}, which is missing"));
    }
    schema
        .get("properties")
        .and_then(|p| p.as_object())
        .unwrap_or_else(|| panic!("{SPEC}: {pointer} has no properties"))
        .keys()
        .cloned()
        .collect()
}

#[test]
fn every_request_schema_has_exactly_the_fields_the_server_reads() {
    use decisio::http::types::*;
    let spec = decisio::http::openapi::file();
    let s = "/components/schemas";
    let tasks = format!("{s}/TaskRequest/properties");
    let pairs: Vec<(String, BTreeSet<String>)> = vec![
        (
            format!("{s}/ChatCompletionRequest"),
            fields_of::<ChatCompletionRequest>(),
        ),
        (
            format!("{s}/CompletionRequest"),
            fields_of::<CompletionRequest>(),
        ),
        (
            format!("{s}/EmbeddingRequest"),
            fields_of::<EmbeddingRequest>(),
        ),
        (
            format!("{s}/TokenizeRequest"),
            fields_of::<TokenizeRequest>(),
        ),
        (
            format!("{s}/DetokenizeRequest"),
            fields_of::<DetokenizeRequest>(),
        ),
        (format!("{s}/DecideRequest"), fields_of::<DecideRequest>()),
        (format!("{s}/DecideQuestion"), fields_of::<DecideQuestion>()),
        (format!("{s}/DecisioRequest"), fields_of::<DecisioRequest>()),
        (format!("{s}/StreamOptions"), fields_of::<StreamOptions>()),
        // The two forms of a registration (`oneOf`) read one struct.
        (
            format!("{s}/TaskRequest|{s}/SystemOneTaskRequest"),
            fields_of::<TaskRequest>(),
        ),
        (
            format!("{tasks}/examples/items"),
            fields_of::<TaskExampleIn>(),
        ),
        (format!("{tasks}/abstention"), fields_of::<AbstentionIn>()),
        (format!("{s}/CertifyBlock"), fields_of::<CertifyIn>()),
        (format!("{s}/CertifyRequest"), fields_of::<CertifyRequest>()),
        (
            format!("{s}/ReferenceTaskRequest"),
            fields_of::<ReferenceTask>(),
        ),
        (
            format!("{s}/ReferenceTaskRequest/properties/examples/items"),
            fields_of::<ReferenceExample>(),
        ),
        (
            format!("{s}/ReferenceCertifyBlock"),
            fields_of::<ReferenceCertify>(),
        ),
        (format!("{tasks}/head"), fields_of::<TaskHeadIn>()),
        (
            format!("{s}/AbstentionTaskRequest"),
            fields_of::<AbstentionRequest>(),
        ),
        (
            format!("{s}/AbstentionTaskRequest/properties/option"),
            fields_of::<OptionIn>(),
        ),
        (
            format!("{s}/AbstentionTaskRequest/properties/examples/items"),
            fields_of::<AbstentionExampleIn>(),
        ),
    ];
    for (pointer, read) in pairs {
        let described: BTreeSet<String> = pointer
            .split('|')
            .flat_map(|p| properties_at(&spec, p))
            .collect();
        assert_eq!(
            described, read,
            "{SPEC} {pointer}: the described properties (left) differ from the fields the \
             server reads (right)"
        );
    }
}

/// The numbers the validation code enforces are the description's.
#[test]
fn the_described_limits_are_the_enforced_ones() {
    use decisio::settings::Limits;
    use decisio::text_route::decide::{MAX_OPTIONS, MAX_QUESTIONS, TEMPERATURE_RANGE};
    use serde_json::json;
    let spec = decisio::http::openapi::file();
    let limits = Limits::default();
    let s = "/components/schemas";
    let at = |p: &str| {
        spec.pointer(p)
            .cloned()
            .unwrap_or_else(|| panic!("{SPEC}: no {p}"))
    };
    for (pointer, enforced) in [
        (
            format!("{s}/DecideRequest/properties/questions/maxItems"),
            json!(MAX_QUESTIONS),
        ),
        (format!("{s}/DecisionOptions/maxItems"), json!(MAX_OPTIONS)),
        (
            format!("{s}/DecisionTemperature/minimum"),
            json!(TEMPERATURE_RANGE.0),
        ),
        (
            format!("{s}/DecisionTemperature/maximum"),
            json!(TEMPERATURE_RANGE.1),
        ),
        (format!("{s}/Stop/oneOf/2/maxItems"), json!(limits.max_stop)),
        (
            format!("{s}/Stop/oneOf/1/maxLength"),
            json!(limits.max_stop_bytes),
        ),
        (
            format!("{s}/EmbeddingRequest/properties/input/oneOf/1/maxItems"),
            json!(limits.max_embedding_inputs),
        ),
        (
            format!("{s}/CompletionRequest/properties/logprob_token_ids/maxItems"),
            json!(limits.max_logprob_token_ids),
        ),
        (
            format!("{s}/CompletionRequest/properties/prompt/oneOf/2/maxItems"),
            json!(limits.max_completion_prompts),
        ),
        (
            format!("{s}/CompletionRequest/properties/prompt/oneOf/3/maxItems"),
            json!(limits.max_completion_prompts),
        ),
        (
            format!("{s}/ChatCompletionRequest/properties/top_logprobs/maximum"),
            json!(limits.max_logprobs),
        ),
        (
            format!("{s}/TaskRequest/properties/labels/maxItems"),
            json!(limits.max_task_labels),
        ),
        (
            format!("{s}/TaskRequest/properties/examples/maxItems"),
            json!(limits.max_task_examples),
        ),
        (
            format!("{s}/TaskRequest/properties/draws/maximum"),
            json!(limits.max_task_draws),
        ),
        (
            format!("{s}/TaskRequest/properties/shots/maximum"),
            json!(limits.max_task_examples),
        ),
        (
            format!("{s}/TaskRequest/properties/name/pattern"),
            json!(format!(
                "^[A-Za-z0-9._-]{{1,{}}}$",
                limits.max_task_name_bytes
            )),
        ),
    ] {
        let described = at(&pointer);
        // 0.001 and 1e-3 are one number.
        let same = match (described.as_f64(), enforced.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => described == enforced,
        };
        assert!(
            same,
            "{SPEC} {pointer} is {described}; the server enforces {enforced}"
        );
    }
}

/// The pattern of a text that must not be blank: a character that is not
/// whitespace as the server counts it (`decisio::text_route::decide::is_blank`),
/// every such character written out (`\S` means other characters in
/// other regex dialects: ECMA-262's takes U+FEFF as whitespace and U+0085
/// not, Python's takes U+001C to U+001F).
fn non_blank_pattern() -> String {
    use decisio::text_route::decide::is_blank;
    let blank: Vec<u32> = (0..=0x10FFFFu32)
        .filter_map(char::from_u32)
        .filter(|c| is_blank(&c.to_string()))
        .map(u32::from)
        .collect();
    let mut class = String::new();
    let mut i = 0;
    while i < blank.len() {
        let mut j = i;
        while j + 1 < blank.len() && blank[j + 1] == blank[j] + 1 {
            j += 1;
        }
        if j - i >= 2 {
            class += &format!("\\u{:04x}-\\u{:04x}", blank[i], blank[j]);
        } else {
            for c in &blank[i..=j] {
                class += &format!("\\u{c:04x}");
            }
        }
        i = j + 1;
    }
    format!("[^{class}]")
}

/// Every text the server refuses when blank is described with the
/// non-blank pattern, and no pattern of the description is `\S`: a lone
/// U+00A0 is blank to both.
#[test]
fn every_non_blank_text_is_described_as_the_server_trims() {
    use decisio::text_route::decide::is_blank;
    let pattern = non_blank_pattern();
    assert_eq!(
        pattern,
        r"[^\u0009-\u000d\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
    );
    assert!(is_blank("\u{a0}") && is_blank("\u{85}") && is_blank(" \t\u{3000}\n"));
    assert!(!is_blank("\u{feff}") && !is_blank("\u{1c}"));
    let spec = decisio::http::openapi::file();
    let s = "/components/schemas";
    for pointer in [
        format!("{s}/DecideRequest/properties/state/pattern"),
        format!("{s}/DecideQuestion/properties/text/pattern"),
        format!("{s}/DecisionOptions/items/pattern"),
        format!("{s}/TaskRequest/properties/question/pattern"),
        format!("{s}/TaskRequest/properties/labels/items/pattern"),
        format!("{s}/TaskRequest/properties/examples/items/properties/state/pattern"),
    ] {
        let described = spec.pointer(&pointer).and_then(|p| p.as_str());
        assert_eq!(
            described,
            Some(pattern.as_str()),
            "{SPEC} {pointer}: the server refuses a blank text there"
        );
    }
    fn patterns(v: &serde_json::Value, at: &str, out: &mut Vec<(String, String)>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    if let (true, Some(p)) = (k == "pattern", x.as_str()) {
                        out.push((at.to_string(), p.to_string()));
                    }
                    patterns(x, &format!("{at}/{k}"), out);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    patterns(x, &format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }
    let mut all = Vec::new();
    patterns(&spec, "", &mut all);
    for (at, p) in &all {
        assert!(
            !p.contains(r"\s") && !p.contains(r"\S"),
            "{SPEC} {at}: the pattern {p} leaves whitespace to the regex dialect"
        );
    }
}

/// Every integer a request may carry is bounded in the description, so a
/// client (or a schema-driven fuzzer) never sends a number the server's
/// 64-bit fields cannot hold; `TokenId`'s bound is the served model's.
#[test]
fn every_integer_a_request_carries_is_bounded() {
    use serde_json::Value;
    fn walk(
        spec: &Value,
        node: &Value,
        at: String,
        seen: &mut BTreeSet<String>,
        loose: &mut Vec<String>,
    ) {
        match node {
            Value::Object(map) => {
                if let Some(r) = map.get("$ref").and_then(Value::as_str) {
                    if seen.insert(r.to_string()) {
                        let target = spec.pointer(r.trim_start_matches('#')).unwrap_or_else(|| {
                            panic!("{SPEC}: {at} refers to {r}, which is missing")
                        });
                        walk(spec, target, r.to_string(), seen, loose);
                    }
                }
                let ty = map.get("type");
                let integer = ty == Some(&Value::from("integer"))
                    || ty
                        .and_then(Value::as_array)
                        .is_some_and(|t| t.contains(&Value::from("integer")));
                let bounded = ["maximum", "exclusiveMaximum", "const", "enum"]
                    .iter()
                    .any(|k| map.contains_key(*k));
                if integer && !bounded && !at.ends_with("/TokenId") {
                    loose.push(at.clone());
                }
                for (k, v) in map {
                    // `if`/`then`/`else`/`not` refine a property defined
                    // (and bounded) beside them.
                    if !["if", "then", "else", "not", "$ref"].contains(&k.as_str()) {
                        walk(spec, v, format!("{at}/{k}"), seen, loose);
                    }
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(spec, v, format!("{at}/{i}"), seen, loose);
                }
            }
            _ => {}
        }
    }
    let spec = decisio::http::openapi::file();
    let mut seen = BTreeSet::new();
    let mut loose = Vec::new();
    for (path, item) in spec["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            if let Some(body) = op.get("requestBody") {
                walk(
                    &spec,
                    body,
                    format!("{method} {path}"),
                    &mut seen,
                    &mut loose,
                );
            }
        }
    }
    assert!(
        loose.is_empty(),
        "{SPEC}: these request integers have no `maximum`; give each the bound of the \
         field that reads it (int64: 9223372036854775807): {loose:#?}"
    );
}
