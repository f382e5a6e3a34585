//! A model folder's chat templates and special tokens, found as
//! transformers finds them: `chat_template.jinja` and
//! `additional_chat_templates/*.jinja` beside `tokenizer_config.json`, else
//! the config's `chat_template` (a string or a list of named templates);
//! the special tokens are the config's `*_token` entries and
//! `extra_special_tokens`.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json};

use super::template::{json_kind, ChatTemplate};
use super::PromptError;

impl ChatTemplate {
    /// Loads the template of a model folder from its `tokenizer_config.json`
    /// (`path` may be that file or the folder holding it), as transformers
    /// does: a sibling `chat_template.jinja` wins over the config's
    /// `chat_template`, which is a string or a list of `{name, template}` of
    /// which "default" is used ("tool_use", if present, when tools are
    /// passed). Template files (`chat_template.jinja` and
    /// `additional_chat_templates/*.jinja`) win over the config's entries,
    /// as in transformers. Special tokens are every `*_token` entry
    /// (a string or an `{"content": ...}` object) and the
    /// `extra_special_tokens` map.
    pub fn from_tokenizer_config(path: impl AsRef<Path>) -> Result<Self, PromptError> {
        let mut path = path.as_ref().to_path_buf();
        if path.is_dir() {
            path.push("tokenizer_config.json");
        }
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            // A template file alone is enough (no special tokens then).
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && path.with_file_name("chat_template.jinja").is_file() =>
            {
                "{}".to_owned()
            }
            Err(source) => return Err(PromptError::Io { path, source }),
        };
        let config: Json = serde_json::from_str(&text).map_err(|source| PromptError::Json {
            path: path.clone(),
            source,
        })?;
        let Json::Object(config) = config else {
            return Err(PromptError::BadConfig {
                path,
                detail: "the file is not a JSON object; it should be a tokenizer_config.json"
                    .into(),
            });
        };
        let special_tokens = special_tokens(&config);
        let (default, tool_use) = match template_files(&path)? {
            Some(files) => files,
            None => template_from_config(&path, config.get("chat_template"))?,
        };
        let template = ChatTemplate::new(default, special_tokens)?;
        match tool_use {
            Some(tool_use) => template.with_tool_use(tool_use),
            None => Ok(template),
        }
    }
}

/// The special tokens transformers puts in `special_tokens_map`: every
/// `*_token` entry holding a token, then the named extra special tokens.
fn special_tokens(config: &Map<String, Json>) -> Vec<(String, String)> {
    let token = |v: &Json| -> Option<String> {
        match v {
            Json::String(s) => Some(s.clone()),
            Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_owned),
            _ => None,
        }
    };
    let mut out: Vec<(String, String)> = Vec::new();
    let mut put = |name: &str, value: String| {
        if let Some(slot) = out.iter_mut().find(|(n, _)| n == name) {
            slot.1 = value;
        } else {
            out.push((name.to_owned(), value));
        }
    };
    for (key, value) in config {
        if key.ends_with("_token") {
            if let Some(t) = token(value) {
                put(key, t);
            }
        }
    }
    if let Some(Json::Object(extra)) = config.get("extra_special_tokens") {
        for (key, value) in extra {
            if let Some(t) = token(value) {
                put(key, t);
            }
        }
    }
    out
}

/// The default and "tool_use" templates of a config's `chat_template`.
fn template_from_config(
    path: &Path,
    entry: Option<&Json>,
) -> Result<(String, Option<String>), PromptError> {
    let bad = |detail: &str| PromptError::BadConfig {
        path: PathBuf::from(path),
        detail: detail.to_owned(),
    };
    match entry {
        None | Some(Json::Null) => Err(PromptError::NoChatTemplate {
            path: path.to_path_buf(),
        }),
        Some(Json::String(s)) => Ok((s.clone(), None)),
        Some(Json::Array(items)) => {
            let mut named = Vec::new();
            for item in items {
                let name = item.get("name").and_then(Json::as_str);
                let template = item.get("template").and_then(Json::as_str);
                let (Some(name), Some(template)) = (name, template) else {
                    return Err(bad(
                        "each entry of `chat_template` must be an object with `name` and `template` strings",
                    ));
                };
                named.push((name.to_owned(), template.to_owned()));
            }
            pick_templates(path, named)
        }
        Some(other) => Err(bad(&format!(
            "`chat_template` must be a string or a list of {{name, template}} objects, not {}",
            json_kind(other)
        ))),
    }
}

/// The templates stored as files beside the config, which transformers
/// prefers to the config's: `chat_template.jinja` (the default) and
/// `additional_chat_templates/NAME.jinja`. `None` when there are none.
fn template_files(config: &Path) -> Result<Option<(String, Option<String>)>, PromptError> {
    let read = |path: PathBuf| {
        std::fs::read_to_string(&path).map_err(|source| PromptError::Io { path, source })
    };
    let mut named = Vec::new();
    let default = config.with_file_name("chat_template.jinja");
    if default.is_file() {
        named.push(("default".to_owned(), read(default)?));
    }
    let extra_dir = config.with_file_name("additional_chat_templates");
    if let Ok(entries) = std::fs::read_dir(&extra_dir) {
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
            .collect();
        files.sort();
        for file in files {
            let name = file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            named.push((name, read(file)?));
        }
    }
    if named.is_empty() {
        return Ok(None);
    }
    pick_templates(config, named).map(Some)
}

fn pick_templates(
    path: &Path,
    named: Vec<(String, String)>,
) -> Result<(String, Option<String>), PromptError> {
    let find = |wanted: &str| {
        named
            .iter()
            .find(|(name, _)| name == wanted)
            .map(|(_, t)| t.clone())
    };
    match find("default") {
        Some(default) => Ok((default, find("tool_use"))),
        None => Err(PromptError::NoDefaultTemplate {
            path: path.to_path_buf(),
            names: named.into_iter().map(|(name, _)| name).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::ChatMessage;
    use serde_json::json;

    #[test]
    fn missing_config_file_is_an_io_error() {
        let err = ChatTemplate::from_tokenizer_config("/nonexistent/decisio/tokenizer_config.json")
            .unwrap_err();
        assert!(matches!(err, PromptError::Io { .. }), "{err:?}");
        assert!(err.to_string().contains("tokenizer_config.json"));
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "decisio-template-test-{}-{tag}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn bad_json_is_reported_with_its_path() {
        let dir = temp_dir("bad-json");
        let path = dir.join("tokenizer_config.json");
        std::fs::write(&path, "{\"chat_template\": ").unwrap();
        let err = ChatTemplate::from_tokenizer_config(&path).unwrap_err();
        assert!(matches!(err, PromptError::Json { .. }), "{err:?}");
        assert!(err.to_string().contains("not valid JSON"));
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn config_without_template_says_so() {
        let dir = temp_dir("no-template");
        std::fs::write(
            dir.join("tokenizer_config.json"),
            "{\"eos_token\": \"</s>\"}",
        )
        .unwrap();
        let err = ChatTemplate::from_tokenizer_config(&dir).unwrap_err();
        assert!(matches!(err, PromptError::NoChatTemplate { .. }), "{err:?}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn template_lists_use_default_and_jinja_file_wins() {
        let dir = temp_dir("list");
        let config = json!({
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "chat_template": [
                {"name": "tool_use", "template": "tools"},
                {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}
            ]
        });
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        let t = ChatTemplate::from_tokenizer_config(&dir).unwrap();
        let msgs = [ChatMessage::new("user", "hi")];
        assert_eq!(t.render(&msgs, false, &Map::new()).unwrap(), "<s>hi</s>");
        // The "tool_use" template is picked when tools are passed, even empty.
        let tools = json!({"tools": []}).as_object().cloned().unwrap();
        assert_eq!(t.render(&msgs, false, &tools).unwrap(), "tools");
        assert_eq!(t.tool_use_source(), Some("tools"));

        std::fs::write(dir.join("chat_template.jinja"), "J{{ messages|length }}\n").unwrap();
        let t = ChatTemplate::from_tokenizer_config(dir.join("tokenizer_config.json")).unwrap();
        assert_eq!(t.render(&msgs, false, &Map::new()).unwrap(), "J1");
        // Template files replace the config's list, tool_use included.
        assert_eq!(t.render(&msgs, false, &tools).unwrap(), "J1");
        std::fs::create_dir_all(dir.join("additional_chat_templates")).unwrap();
        std::fs::write(dir.join("additional_chat_templates/tool_use.jinja"), "T").unwrap();
        let t = ChatTemplate::from_tokenizer_config(&dir).unwrap();
        assert_eq!(t.render(&msgs, false, &tools).unwrap(), "T");
        std::fs::remove_dir_all(dir.join("additional_chat_templates")).unwrap();
        std::fs::remove_file(dir.join("tokenizer_config.json")).unwrap();
        let t = ChatTemplate::from_tokenizer_config(&dir).unwrap();
        assert_eq!(t.render(&msgs, false, &Map::new()).unwrap(), "J1");
        std::fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();

        let config = json!({"chat_template": [{"name": "a", "template": "x"}]});
        std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        let err = ChatTemplate::from_tokenizer_config(&dir).unwrap_err();
        assert!(
            matches!(err, PromptError::NoDefaultTemplate { .. }),
            "{err:?}"
        );
        std::fs::remove_dir_all(dir).ok();
    }
}
