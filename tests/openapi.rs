//! `openapi/openapi.yaml` describes exactly the routes the server has
//! (`decisio::server::ROUTES`), and the parts every client relies on.

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
    let served: BTreeSet<(String, String)> = decisio::server::ROUTES
        .iter()
        .map(|&(method, path)| (method.to_string(), path.to_string()))
        .collect();
    assert_eq!(
        served.len(),
        decisio::server::ROUTES.len(),
        "server::ROUTES lists a route twice"
    );
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let not_served: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty() && not_served.is_empty(),
        "{SPEC} and server::ROUTES differ:\n  served but not documented: {undocumented:?}\n  \
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
