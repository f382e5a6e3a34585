//! The one reader of a conversion's `config.json` and
//! `generation_config.json`.
//!
//! Vision-language conversions (Gemma 4's `gemma4`, Qwen3.5's wrappers)
//! nest the language model's settings under `text_config`; text-only ones
//! keep them at the top. Every part of decisio that reads a model's
//! settings (the bases, the MLX architectures, the model card, the vLLM
//! backend's context length) goes through [`read`] and [`text`] or [`get`],
//! so a setting is found in the same place whichever way it is nested.

use std::path::Path;

use serde_json::Value;

/// `DIR/config.json`, parsed; the error says which file and what is wrong.
pub fn read(dir: &Path) -> Result<Value, String> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "cannot read {}: {e}; --model must name an MLX conversion folder",
            path.display()
        )
    })?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not valid JSON: {e}", path.display()))
}

/// `DIR/generation_config.json`, parsed; `None` when the folder has none or
/// it is not valid JSON (a conversion need not carry one).
pub fn read_generation(dir: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join("generation_config.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// The ids of a generation config's `eos_token_id`, a number or a list
/// (none when it is neither).
pub fn eos_token_ids(generation: &Value) -> Vec<u32> {
    match generation.get("eos_token_id") {
        Some(Value::Number(n)) => n.as_u64().map(|n| n as u32).into_iter().collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|n| n as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether the language model's settings are nested under `text_config`.
pub fn is_nested(config: &Value) -> bool {
    config.get("text_config").is_some_and(Value::is_object)
}

/// The language model's settings: `text_config` when nested, else the
/// whole config. A wrapper's own `vocab_size` is the language model's (the
/// output layer is the wrapper's), so it replaces the nested one.
pub fn text(config: &Value) -> Value {
    if !is_nested(config) {
        return config.clone();
    }
    let mut text = config["text_config"].clone();
    if let (Some(v), Some(t)) = (config.get("vocab_size"), text.as_object_mut()) {
        t.insert("vocab_size".into(), v.clone());
    }
    text
}

/// A setting by key: the top level first, then `text_config`.
pub fn get<'a>(config: &'a Value, key: &str) -> Option<&'a Value> {
    config
        .get(key)
        .or_else(|| config.get("text_config").and_then(|t| t.get(key)))
}

/// A whole-number setting by key ([`get`]).
pub fn get_usize(config: &Value, key: &str) -> Option<usize> {
    get(config, key).and_then(Value::as_u64).map(|v| v as usize)
}

/// The `model_type`s of the config: the top level's, then the nested
/// language model's.
pub fn model_types(config: &Value) -> Vec<&str> {
    [Some(config), config.get("text_config")]
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("model_type").and_then(Value::as_str))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nested_settings_are_found_and_the_wrappers_vocabulary_wins() {
        let c = json!({"model_type": "gemma4", "vocab_size": 77,
                       "text_config": {"model_type": "gemma4_text", "vocab_size": 5,
                                       "hidden_size": 8, "max_position_embeddings": 64}});
        assert!(is_nested(&c));
        assert_eq!(text(&c)["vocab_size"], 77);
        assert_eq!(text(&c)["hidden_size"], 8);
        assert_eq!(get_usize(&c, "hidden_size"), Some(8));
        assert_eq!(get_usize(&c, "vocab_size"), Some(77));
        assert_eq!(get_usize(&c, "max_position_embeddings"), Some(64));
        assert_eq!(model_types(&c), ["gemma4", "gemma4_text"]);
    }

    #[test]
    fn a_flat_config_is_its_own_text_config() {
        let c = json!({"model_type": "llama", "hidden_size": 4});
        assert!(!is_nested(&c));
        assert_eq!(text(&c), c);
        assert_eq!(get_usize(&c, "hidden_size"), Some(4));
        assert_eq!(get_usize(&c, "vocab_size"), None);
        assert_eq!(model_types(&c), ["llama"]);
    }

    #[test]
    fn a_missing_or_broken_file_names_itself() {
        let dir = std::env::temp_dir().join(format!("decisio-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(read(&dir).unwrap_err().contains("config.json"));
        std::fs::write(dir.join("config.json"), "{").unwrap();
        assert!(read(&dir).unwrap_err().contains("not valid JSON"));
        std::fs::write(dir.join("config.json"), r#"{"a": 1}"#).unwrap();
        assert_eq!(read(&dir).unwrap(), json!({"a": 1}));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn eos_token_ids_are_a_number_or_a_list() {
        assert_eq!(eos_token_ids(&json!({"eos_token_id": 2})), [2]);
        assert_eq!(eos_token_ids(&json!({"eos_token_id": [1, 7, "x"]})), [1, 7]);
        assert_eq!(eos_token_ids(&json!({"eos_token_id": null})), [0u32; 0]);
        let dir = std::env::temp_dir().join(format!("decisio-generation-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read_generation(&dir), None);
        std::fs::write(dir.join("generation_config.json"), "{").unwrap();
        assert_eq!(read_generation(&dir), None);
        std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": 3}"#).unwrap();
        assert_eq!(read_generation(&dir), Some(json!({"eos_token_id": 3})));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
