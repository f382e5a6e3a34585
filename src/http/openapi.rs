//! `GET /openapi.json`: `openapi/openapi.yaml`, built into the binary, as
//! this server is configured.
//!
//! The file describes every configuration at once. The served copy narrows
//! what depends on how the server was started, so that a client (or a
//! property-based tester) generated from it meets exactly this server:
//!
//! - `security`: the file lists no key or a bearer key; served, it is a
//!   bearer key with `--api-key`, none without.
//! - the bounds that are flags or the model's: the largest token id (the
//!   vocabulary), `max_tokens` (the context, `--max-model-len`), the
//!   alternatives per token (`--max-logprobs`);
//! - what the backend runs: the `multi_question` modes, and `intent` tasks
//!   only where it returns hidden states.
//!
//! Nothing else differs (`docs/design/openapi.md`).

use serde_json::{json, Value};

/// The description as written, YAML.
pub const SPEC_YAML: &str = include_str!("../../openapi/openapi.yaml");

/// What the served description says of this server.
#[derive(Clone, Debug)]
pub struct Served {
    pub api_key: bool,
    pub vocab_size: usize,
    pub context_length: usize,
    pub max_logprobs: usize,
    /// The embeddings' one `dimensions`, where known.
    pub hidden_size: Option<usize>,
    /// The `multi_question` modes the backend runs.
    pub modes: Vec<&'static str>,
    /// The blocks an intent task's head may read (`Engine::hidden_layers`;
    /// 0: the final norm's output only); `None`: no hidden states, so no
    /// `intent` tasks.
    pub hidden_layers: Option<usize>,
}

/// The description as written, as JSON.
pub fn file() -> Value {
    // The file is part of the build and a unit test parses it, so it is
    // valid YAML whose keys are strings.
    serde_yaml_ng::from_str(SPEC_YAML)
        .expect("openapi/openapi.yaml parses as JSON-compatible YAML (a unit test checks it)")
}

/// The description as served. Operations that need no key (`/health`,
/// `/metrics`) keep their own `security: []`.
pub fn document(served: &Served) -> Value {
    let mut spec = file();
    spec["security"] = if served.api_key {
        json!([{ "bearerAuth": [] }])
    } else {
        json!([])
    };
    let schemas = &mut spec["components"]["schemas"];
    schemas["TokenId"]["maximum"] = json!(served.vocab_size.saturating_sub(1));
    let max_new = served.context_length.saturating_sub(1);
    schemas["ChatCompletionRequest"]["properties"]["max_tokens"]["maximum"] = json!(max_new);
    schemas["ChatCompletionRequest"]["properties"]["max_completion_tokens"]["maximum"] =
        json!(max_new);
    schemas["CompletionRequest"]["properties"]["max_tokens"]["maximum"] = json!(max_new);
    schemas["ChatCompletionRequest"]["properties"]["top_logprobs"]["maximum"] =
        json!(served.max_logprobs);
    schemas["CompletionRequest"]["properties"]["logprobs"]["maximum"] = json!(served.max_logprobs);
    let mut modes: Vec<Value> = served.modes.iter().map(|m| json!(m)).collect();
    modes.push(Value::Null);
    schemas["DecideRequest"]["properties"]["multi_question"]["enum"] = Value::Array(modes);
    if let Some(width) = served.hidden_size {
        schemas["EmbeddingRequest"]["properties"]["dimensions"]["enum"] = json!([width, null]);
    }
    match served.hidden_layers {
        Some(layers) => {
            schemas["TaskRequest"]["properties"]["head"]["properties"]["layer"]["maximum"] =
                json!(layers as i64 - 1);
        }
        None => schemas["TaskRequest"]["properties"]["kind"]["enum"] = json!(["choice"]),
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(api_key: bool) -> Served {
        Served {
            api_key,
            vocab_size: 49152,
            context_length: 512,
            max_logprobs: 5,
            hidden_size: Some(576),
            modes: vec!["sequential"],
            hidden_layers: Some(30),
        }
    }

    #[test]
    fn the_served_description_says_whether_a_key_is_needed() {
        let file = file();
        assert_eq!(
            file["security"],
            json!([{}, { "bearerAuth": [] }]),
            "the file describes both configurations: no key, or a bearer key"
        );
        assert_eq!(
            document(&served(true))["security"],
            json!([{ "bearerAuth": [] }])
        );
        assert_eq!(document(&served(false))["security"], json!([]));
        assert_eq!(document(&served(false))["paths"], file["paths"]);
    }

    /// Every place the served copy narrows exists in the file, so a
    /// renamed schema cannot silently leave the served bound unset.
    #[test]
    fn the_served_bounds_replace_the_files() {
        let file = file();
        let doc = document(&served(false));
        let s = |v: &Value, path: &str| v.pointer(path).cloned();
        for (path, want) in [
            ("/components/schemas/TokenId/maximum", json!(49151)),
            (
                "/components/schemas/ChatCompletionRequest/properties/max_tokens/maximum",
                json!(511),
            ),
            (
                "/components/schemas/ChatCompletionRequest/properties/max_completion_tokens/maximum",
                json!(511),
            ),
            (
                "/components/schemas/CompletionRequest/properties/max_tokens/maximum",
                json!(511),
            ),
            (
                "/components/schemas/ChatCompletionRequest/properties/top_logprobs/maximum",
                json!(5),
            ),
            (
                "/components/schemas/CompletionRequest/properties/logprobs/maximum",
                json!(5),
            ),
            (
                "/components/schemas/EmbeddingRequest/properties/dimensions/enum",
                json!([576, null]),
            ),
            (
                "/components/schemas/DecideRequest/properties/multi_question/enum",
                json!(["sequential", null]),
            ),
            (
                "/components/schemas/TaskRequest/properties/head/properties/layer/maximum",
                json!(29),
            ),
        ] {
            let parent = path.rsplit_once('/').unwrap().0;
            assert!(
                s(&file, parent).is_some(),
                "{path}: the file has no {parent}"
            );
            assert_eq!(s(&doc, path), Some(want), "{path}");
        }
        let mut no_hidden = served(false);
        no_hidden.hidden_layers = None;
        assert_eq!(
            document(&no_hidden)["components"]["schemas"]["TaskRequest"]["properties"]["kind"]
                ["enum"],
            json!(["choice"])
        );
    }
}
