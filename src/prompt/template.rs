//! Hugging Face chat templates, rendered as transformers renders them: the
//! compiled template and its special tokens, and the conversation turned
//! into the template's variables. The environment it compiles in is in
//! `environment.rs`; loading a model folder's template is in
//! `tokenizer_config.rs`.

use std::fmt;
use std::str::FromStr;

use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use super::environment::{environment, RaisedByTemplate};
use super::source;
use super::PromptError;

const TEMPLATE_NAME: &str = "chat_template";
const TOOL_USE_NAME: &str = "tool_use";

/// One chat message, the typed form of what templates read. Any JSON object
/// works as a message too (see [`ChatTemplate::render`]); this covers the
/// common fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// A string, or a list of content parts (`{"type": "text", "text": ...}`),
    /// passed to the template as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Json>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Json>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with plain text content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: Some(Json::String(content.into())),
            ..Default::default()
        }
    }
}

/// A compiled chat template plus the special tokens transformers hands it
/// (`bos_token`, `eos_token`, ...).
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    /// The template transformers picks instead when tools are passed.
    tool_use: Option<String>,
    special_tokens: Vec<(String, String)>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

impl FromStr for ChatTemplate {
    type Err = PromptError;

    /// A template from its source, with no special tokens.
    fn from_str(source: &str) -> Result<Self, PromptError> {
        ChatTemplate::new(source, Vec::new())
    }
}

impl ChatTemplate {
    /// Compiles `source` with transformers' environment. `special_tokens`
    /// are the template variables transformers derives from the tokenizer
    /// (`("bos_token", "<s>")`, ...).
    pub fn new(
        source: impl Into<String>,
        special_tokens: Vec<(String, String)>,
    ) -> Result<Self, PromptError> {
        let source = source.into();
        let mut env = environment();
        compile(&mut env, TEMPLATE_NAME, &source)?;
        Ok(ChatTemplate {
            env,
            source,
            tool_use: None,
            special_tokens,
        })
    }

    /// Adds the template to use when tools are passed (transformers' named
    /// template "tool_use").
    pub fn with_tool_use(mut self, source: impl Into<String>) -> Result<Self, PromptError> {
        let source = source.into();
        compile(&mut self.env, TOOL_USE_NAME, &source)?;
        self.tool_use = Some(source);
        Ok(self)
    }

    /// The template source as written (before any adaptation).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The "tool_use" template's source, if the model has one.
    pub fn tool_use_source(&self) -> Option<&str> {
        self.tool_use.as_deref()
    }

    /// The special-token variables the template sees.
    pub fn special_tokens(&self) -> &[(String, String)] {
        &self.special_tokens
    }

    /// Whether the template source mentions `name` as a whole identifier,
    /// e.g. `supports("enable_thinking")` or `supports("tools")`.
    pub fn supports(&self, name: &str) -> bool {
        let is_ident = |c: char| c.is_alphanumeric() || c == '_';
        let mentions = |source: &str| {
            source.match_indices(name).any(|(at, _)| {
                let before = source[..at].chars().next_back();
                let after = source[at + name.len()..].chars().next();
                !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
            })
        };
        mentions(&self.source) || self.tool_use.as_deref().is_some_and(mentions)
    }

    /// Whether the template reads `enable_thinking`.
    pub fn supports_enable_thinking(&self) -> bool {
        self.supports("enable_thinking")
    }

    /// Renders a conversation as
    /// `tokenizer.apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=..., **extra)` does.
    ///
    /// `messages` are anything that serializes to JSON objects
    /// ([`ChatMessage`], `serde_json::Value`). As in transformers, keys whose
    /// value is null are dropped and the reasoning fields
    /// (`reasoning_content`, `thinking`, `reasoning`) are aliased to each
    /// other. `extra` holds the template arguments (`enable_thinking`,
    /// `tools`, `documents`, ...); `tools` and `documents` are always defined
    /// (null when absent), as transformers passes them.
    pub fn render<M: Serialize>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<String, PromptError> {
        if messages.is_empty() {
            return Err(PromptError::EmptyConversation);
        }
        let mut chat = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            let value = serde_json::to_value(message).map_err(|e| PromptError::BadMessage {
                index,
                detail: e.to_string(),
            })?;
            let Json::Object(message) = value else {
                return Err(PromptError::BadMessage {
                    index,
                    detail: format!("got {}", json_kind(&value)),
                });
            };
            chat.push(Json::Object(normalize_message(message)));
        }

        let mut ctx: Map<String, Json> = Map::new();
        for (name, token) in &self.special_tokens {
            ctx.insert(name.clone(), Json::String(token.clone()));
        }
        for (key, value) in extra {
            ctx.insert(key.clone(), value.clone());
        }
        ctx.insert("messages".into(), Json::Array(chat));
        for key in ["tools", "documents"] {
            ctx.entry(key).or_insert(Json::Null);
        }
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(add_generation_prompt),
        );

        // transformers picks "tool_use" whenever tools are passed at all.
        let tools_passed = extra.get("tools").is_some_and(|t| !t.is_null());
        let name = if tools_passed && self.tool_use.is_some() {
            TOOL_USE_NAME
        } else {
            TEMPLATE_NAME
        };
        let template = self
            .env
            .get_template(name)
            .map_err(|e| PromptError::TemplateSyntax {
                detail: describe(&e),
            })?;
        template
            .render(Value::from_serialize(&ctx))
            .map_err(render_error)
    }
}

/// Adapts and compiles one template into `env`.
fn compile(
    env: &mut Environment<'static>,
    name: &'static str,
    source: &str,
) -> Result<(), PromptError> {
    let adapted = source::adapt(source).map_err(|detail| PromptError::TemplateSyntax {
        detail: format!("bad escape in a string literal: {detail}"),
    })?;
    env.add_template_owned(name, adapted)
        .map_err(|e| PromptError::TemplateSyntax {
            detail: describe(&e),
        })
}

fn render_error(err: Error) -> PromptError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = cause {
        if let Some(raised) = e.downcast_ref::<RaisedByTemplate>() {
            return PromptError::TemplateRaised {
                message: raised.0.clone(),
            };
        }
        cause = e.source();
    }
    match err.kind() {
        ErrorKind::SyntaxError => PromptError::TemplateSyntax {
            detail: describe(&err),
        },
        _ => PromptError::Render {
            detail: describe(&err),
        },
    }
}

/// An error's text with the template line it happened on.
fn describe(err: &Error) -> String {
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(err);
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

/// transformers' message clean-up: null-valued keys are dropped, and a
/// message with reasoning under any of its names gets it as `thinking` (first)
/// and `reasoning_content` (last).
fn normalize_message(message: Map<String, Json>) -> Map<String, Json> {
    let message: Map<String, Json> = message.into_iter().filter(|(_, v)| !v.is_null()).collect();
    let reasoning = ["reasoning_content", "thinking", "reasoning"]
        .iter()
        .find_map(|k| message.get(*k).cloned());
    let Some(reasoning) = reasoning else {
        return message;
    };
    let mut out = Map::new();
    out.insert("thinking".into(), reasoning.clone());
    for (k, v) in message {
        out.insert(k, v);
    }
    out.insert("reasoning_content".into(), reasoning);
    out
}

/// What a JSON value is, for error messages (`a string`, `an array`).
pub(super) fn json_kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(source: &str, messages: Json, extra: Json) -> Result<String, PromptError> {
        let t = ChatTemplate::from_str(source)?;
        let messages = messages.as_array().cloned().unwrap_or_default();
        let extra = extra.as_object().cloned().unwrap_or_default();
        t.render(&messages, false, &extra)
    }

    fn user(text: &str) -> Json {
        json!([{"role": "user", "content": text}])
    }

    #[test]
    fn raise_exception_propagates_the_templates_message() {
        let err = render(
            "{% if messages[0].role != 'system' %}{{ raise_exception('System first, please.') }}{% endif %}",
            user("hi"),
            json!({}),
        )
        .unwrap_err();
        match &err {
            PromptError::TemplateRaised { message } => assert_eq!(message, "System first, please."),
            other => panic!("expected TemplateRaised, got {other:?}"),
        }
        assert!(err.to_string().contains("System first, please."));
    }

    #[test]
    fn raise_exception_inside_a_macro_still_propagates() {
        let err = render(
            "{% macro check(m) %}{% if m.role == 'user' %}{{ raise_exception('no ' + m.role) }}{% endif %}{% endmacro %}{% for m in messages %}{{ check(m) }}{% endfor %}",
            user("hi"),
            json!({}),
        )
        .unwrap_err();
        assert!(
            matches!(err, PromptError::TemplateRaised { ref message } if message == "no user"),
            "{err:?}"
        );
    }

    #[test]
    fn syntax_errors_are_reported_at_load() {
        let err = ChatTemplate::from_str("{% for m in messages %}{{ m.content }}").unwrap_err();
        assert!(matches!(err, PromptError::TemplateSyntax { .. }), "{err:?}");
    }

    #[test]
    fn empty_conversation_and_non_object_messages_are_rejected() {
        let t = ChatTemplate::from_str("x").unwrap();
        let none: [Json; 0] = [];
        assert!(matches!(
            t.render(&none, false, &Map::new()),
            Err(PromptError::EmptyConversation)
        ));
        let err = t.render(&[json!("hi")], false, &Map::new()).unwrap_err();
        assert!(
            matches!(err, PromptError::BadMessage { index: 0, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn values_print_like_python() {
        let out = render(
            "{{ none }}|{{ true }}|{{ [1, 'a', none] }}|{{ {'k': 2.0} }}|{{ undefined_name }}|{{ 1.5e-7 }}|{{ true|string }}",
            user("x"),
            json!({}),
        )
        .unwrap();
        assert_eq!(out, "None|True|[1, 'a', None]|{'k': 2.0}||1.5e-07|True");
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        let out = render(
            "{{ tools|tojson }}\n{{ tools[0]|tojson(indent=2) }}\n{{ tools|tojson(sort_keys=true, separators=[',', ':']) }}\n{{ 'é<'|tojson(ensure_ascii=true) }}",
            user("x"),
            json!({"tools": [{"b": "<é>", "a": [1, 2.5, null, false]}]}),
        )
        .unwrap();
        assert_eq!(
            out,
            "[{\"b\": \"<é>\", \"a\": [1, 2.5, null, false]}]\n{\n  \"b\": \"<é>\",\n  \"a\": [\n    1,\n    2.5,\n    null,\n    false\n  ]\n}\n[{\"a\":[1,2.5,null,false],\"b\":\"<é>\"}]\n\"\\u00e9<\""
        );
    }

    #[test]
    fn whitespace_control_matches_transformers() {
        // trim_blocks and lstrip_blocks on; one trailing newline dropped.
        let source = "{% for m in messages %}\n    {% if true %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
        assert_eq!(render(source, user("a"), json!({})).unwrap(), "[a]\n");
    }

    #[test]
    fn loop_controls_and_python_methods_work() {
        let out = render(
            "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{% if loop.index0 > 2 %}{% break %}{% endif %}{{ m.content.strip().split()|join(',') }};{% endfor %}",
            json!([
                {"role": "user", "content": " a b \u{1f}"},
                {"role": "user", "content": "skip"},
                {"role": "user", "content": "c\td"},
                {"role": "user", "content": "never"}
            ]),
            json!({}),
        )
        .unwrap();
        assert_eq!(out, "a,b;c,d;");
    }

    #[test]
    fn generation_tags_render_their_body() {
        let out = render(
            "{% for m in messages %}{% generation %}<{{ m.content }}>{%- endgeneration %}{% endfor %}",
            user("a"),
            json!({}),
        )
        .unwrap();
        assert_eq!(out, "<a>");
    }

    #[test]
    fn null_fields_are_dropped_and_reasoning_is_aliased() {
        let out = render(
            "{% for m in messages %}{{ m.keys()|list }} {{ m.content is defined }} {{ m.thinking }}{% endfor %}",
            json!([{"role": "assistant", "content": null, "reasoning": "r"}]),
            json!({}),
        )
        .unwrap();
        assert_eq!(
            out,
            "['thinking', 'role', 'reasoning', 'reasoning_content'] False r"
        );
    }

    #[test]
    fn tools_and_documents_are_always_defined() {
        let out = render(
            "{{ tools is defined }} {{ tools is none }} {{ documents is none }} {{ add_generation_prompt }}",
            user("x"),
            json!({}),
        )
        .unwrap();
        assert_eq!(out, "True True True False");
    }

    #[test]
    fn supports_finds_whole_identifiers() {
        let t = ChatTemplate::from_str(
            "{% if enable_thinking is defined and enable_thinking is false %}x{% endif %}",
        )
        .unwrap();
        assert!(t.supports_enable_thinking());
        assert!(!t.supports("thinking"));
        assert!(!t.supports("tools"));
    }

    #[test]
    fn strftime_now_formats_the_current_date() {
        let out = render("{{ strftime_now('%Y') }}", user("x"), json!({})).unwrap();
        let year: i64 = out.parse().unwrap();
        assert!(year >= 2024, "{out}");
    }
}
