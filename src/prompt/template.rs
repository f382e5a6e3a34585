//! Hugging Face chat templates, rendered as transformers renders them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use minijinja::value::{from_args, Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use super::python;
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

/// The environment transformers builds: `trim_blocks`, `lstrip_blocks`, no
/// autoescape, `loopcontrols`, its `tojson`, `raise_exception` and
/// `strftime_now`, plus Python's printing and string methods.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_formatter(|out, _state, value| {
        out.write_str(&python::py_str(value))
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "could not write output"))
    });
    env.set_unknown_method_callback(python_method);
    env.add_filter("tojson", tojson);
    env.add_filter("trim", trim);
    env.add_filter("string", |value: Value| python::py_str(&value));
    env.add_filter("join", join);
    env.add_filter(
        "replace",
        |value: Value, old: String, new: String, count: Option<i64>| {
            let s = python::py_str(&value);
            match count.and_then(|n| usize::try_from(n).ok()) {
                Some(n) => s.replacen(&old, &new, n),
                None => s.replace(&old, &new),
            }
        },
    );
    env.add_filter("center", |value: Value, width: Option<usize>| {
        python::center(&python::py_str(&value), width.unwrap_or(80))
    });
    env.add_filter("wordcount", |value: Value| {
        python::wordcount(&python::py_str(&value))
    });
    // jinja2 filters and globals MiniJinja keeps in its contrib crate.
    env.add_filter("truncate", truncate);
    env.add_filter("indent", indent);
    env.add_filter("round", round);
    env.add_filter("striptags", minijinja_contrib::filters::striptags);
    env.add_filter("filesizeformat", minijinja_contrib::filters::filesizeformat);
    env.add_function("cycler", minijinja_contrib::globals::cycler);
    env.add_function("joiner", minijinja_contrib::globals::joiner);
    env.add_filter("format", |format: String, args: Rest<Value>| {
        python::percent_format(&format, &args)
    });
    env.add_filter("items", |value: &Value| -> Result<Value, Error> {
        if value.is_undefined() {
            return Ok(Value::from(Vec::<Value>::new()));
        }
        python::into_tuples(&minijinja::filters::items(value)?)
    });
    env.add_filter(
        "dictsort",
        |value: &Value, kwargs: Kwargs| -> Result<Value, Error> {
            python::into_tuples(&minijinja::filters::dictsort(value, kwargs)?)
        },
    );
    // jinja2's tests, with Python's types: booleans are numbers, strings and
    // dicts are sequences, undefined is an empty iterable, `lower`/`upper`
    // need a cased character.
    env.add_test("number", |v: &Value| {
        matches!(v.kind(), ValueKind::Number | ValueKind::Bool)
    });
    env.add_test("integer", |v: &Value| {
        v.kind() == ValueKind::Number && v.is_integer()
    });
    env.add_test("float", |v: &Value| {
        v.kind() == ValueKind::Number && !v.is_integer()
    });
    env.add_test("sequence", |v: &Value| {
        matches!(
            v.kind(),
            ValueKind::String
                | ValueKind::Seq
                | ValueKind::Map
                | ValueKind::Iterable
                | ValueKind::Undefined
        )
    });
    env.add_test("iterable", |v: &Value| {
        matches!(
            v.kind(),
            ValueKind::String
                | ValueKind::Bytes
                | ValueKind::Seq
                | ValueKind::Map
                | ValueKind::Iterable
                | ValueKind::Undefined
        )
    });
    env.add_test("lower", |v: &Value| {
        v.as_str().is_some_and(python::is_lower)
    });
    env.add_test("upper", |v: &Value| {
        v.as_str().is_some_and(python::is_upper)
    });
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", |format: String| {
        python::strftime(&python::CivilTime::now_utc(), &format)
    });
    env
}

/// The error a template's `raise_exception(message)` produces, kept as the
/// error's source so that rendering can report the template's own message.
#[derive(Debug)]
struct RaisedByTemplate(String);

impl fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedByTemplate {}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let message = python::py_str(&message);
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedByTemplate(message)))
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

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, arguments by position or name.
fn tojson(value: &Value, args: Rest<Value>) -> Result<Value, Error> {
    let (positional, kwargs) = split_kwargs(args.0)?;
    if positional.len() > 4 {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let mut positional = positional.into_iter();
    let (ensure_ascii, indent, separators, sort_keys) = (
        positional.next(),
        positional.next(),
        positional.next(),
        positional.next(),
    );
    let pick = |positional: Option<Value>, name: &str| -> Result<Option<Value>, Error> {
        let named: Option<Value> = kwargs.get(name)?;
        Ok(positional
            .or(named)
            .filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let sort_keys = pick(sort_keys, "sort_keys")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => {
            let n = v.as_i64().ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                )
            })?;
            Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
        }
    };
    let separators = match pick(separators, "separators")? {
        None => None,
        Some(v) => {
            let parts: Vec<String> = v
                .try_iter()?
                .map(|p| p.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .filter(|p: &Vec<String>| p.len() == 2)
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings (item, key)",
                    )
                })?;
            Some((parts[0].clone(), parts[1].clone()))
        }
    };
    kwargs.assert_all_used()?;
    let opts = python::JsonOptions {
        ensure_ascii,
        indent,
        separators,
        sort_keys,
    };
    python::json_dumps(value, &opts)
        .map(Value::from)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))
}

/// jinja2's `join(value, d='', attribute=None)`: `d.join(map(str, value))`.
fn join(value: &Value, joiner: Option<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let named: Option<Value> = kwargs.get("d")?;
    let joiner = joiner
        .or(named)
        .map(|j| python::py_str(&j))
        .unwrap_or_default();
    let attribute: Option<Value> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    if value.is_undefined() {
        return Ok(String::new());
    }
    let mut parts = Vec::new();
    for item in value.try_iter()? {
        let item = match &attribute {
            Some(path) => attribute_path(&item, path)?,
            None => item,
        };
        parts.push(python::py_str(&item));
    }
    Ok(parts.join(&joiner))
}

/// jinja2's attribute getter: a dotted path whose integer parts index.
fn attribute_path(value: &Value, path: &Value) -> Result<Value, Error> {
    if let Some(index) = path.as_i64() {
        return value.get_item(&Value::from(index));
    }
    let mut current = value.clone();
    for part in python::py_str(path).split('.') {
        current = match part.parse::<i64>() {
            Ok(index) => current.get_item(&Value::from(index))?,
            Err(_) => current.get_attr(part)?,
        };
    }
    Ok(current)
}

/// Positional arguments and the keyword arguments passed after them.
fn split_kwargs(mut args: Vec<Value>) -> Result<(Vec<Value>, Kwargs), Error> {
    let kwargs = match args.last() {
        Some(last) if last.is_kwargs() => {
            let last = args.pop().unwrap_or_default();
            from_args::<(Kwargs,)>(&[last])?.0
        }
        _ => Kwargs::from_iter(std::iter::empty::<(&str, Value)>()),
    };
    Ok((args, kwargs))
}

/// jinja2's `truncate(s, length=255, killwords=False, end='...',
/// leeway=None)`, positional or named, on MiniJinja-contrib's implementation.
fn truncate(state: &State, value: &Value, args: Rest<Value>) -> Result<Value, Error> {
    let (positional, kwargs) = split_kwargs(args.0)?;
    const NAMES: [&str; 4] = ["length", "killwords", "end", "leeway"];
    if positional.len() > NAMES.len() {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let mut named: Vec<(String, Value)> = NAMES
        .iter()
        .zip(positional)
        .map(|(n, v)| (n.to_string(), v))
        .collect();
    for name in kwargs.args() {
        named.push((name.to_owned(), kwargs.peek::<Value>(name)?));
    }
    let value = Value::from(python::py_str(value));
    minijinja_contrib::filters::truncate(state, &value, Kwargs::from_iter(named))
}

/// jinja2's `indent(s, width=4, first=False, blank=False)`; `width` may be
/// the indentation string itself.
fn indent(value: &Value, args: Rest<Value>) -> Result<String, Error> {
    let (positional, kwargs) = split_kwargs(args.0)?;
    if positional.len() > 3 {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let mut positional = positional.into_iter();
    let mut arg = |name: &str| -> Result<Option<Value>, Error> {
        let named: Option<Value> = kwargs.get(name)?;
        Ok(positional.next().or(named))
    };
    let width = arg("width")?;
    let first = arg("first")?.is_some_and(|v| v.is_true());
    let blank = arg("blank")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let indentation = match width {
        None => "    ".to_owned(),
        Some(w) if w.kind() == ValueKind::String => w.as_str().unwrap_or_default().to_owned(),
        Some(w) => " ".repeat(
            w.as_i64()
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(0),
        ),
    };
    Ok(python::indent(
        &python::py_str(value),
        &indentation,
        first,
        blank,
    ))
}

/// jinja2's `round(value, precision=0, method='common')`: `common` is
/// Python's `round`, which rounds ties to even; `ceil` and `floor` scale.
fn round(value: &Value, args: Rest<Value>) -> Result<Value, Error> {
    let (positional, kwargs) = split_kwargs(args.0)?;
    if positional.len() > 2 {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let mut positional = positional.into_iter();
    let precision: Option<Value> = positional.next().or(kwargs.get("precision")?);
    let method: Option<Value> = positional.next().or(kwargs.get("method")?);
    kwargs.assert_all_used()?;
    let precision = precision.and_then(|p| p.as_i64()).unwrap_or(0);
    let method = method
        .map(|m| python::py_str(&m))
        .unwrap_or_else(|| "common".into());
    if value.is_integer() && method == "common" && precision >= 0 {
        return Ok(value.clone());
    }
    let x = f64::try_from(value.clone()).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("cannot round value ({})", value.kind()),
        )
    })?;
    let scale = 10f64.powi(precision as i32);
    let rounded = match method.as_str() {
        "common" if precision >= 0 => format!("{x:.prec$}", prec = precision as usize)
            .parse::<f64>()
            .unwrap_or(x),
        "common" => (x * scale).round_ties_even() / scale,
        "ceil" => (x * scale).ceil() / scale,
        "floor" => (x * scale).floor() / scale,
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("method must be 'common', 'ceil' or 'floor', not {other:?}"),
            ))
        }
    };
    Ok(Value::from(rounded))
}

/// jinja2's `trim(value, chars=None)`, which is `str.strip(chars)`.
fn trim(value: &Value, chars: Option<Value>) -> String {
    let s = python::py_str(value);
    let chars = chars.as_ref().and_then(Value::as_str);
    python::strip(&s, chars, true, true).to_owned()
}

/// Python methods on template values. Whitespace handling follows Python;
/// the rest is minijinja-contrib's pycompat.
fn python_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        let text_arg = |i: usize| -> Result<Option<&str>, Error> {
            match args.get(i) {
                None => Ok(None),
                Some(v) if v.is_none() || v.is_undefined() => Ok(None),
                Some(v) => v.as_str().map(Some).ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        format!("{method}: argument must be a string or None"),
                    )
                }),
            }
        };
        let too_many = |n: usize| {
            if args.len() > n {
                Err(Error::from(ErrorKind::TooManyArguments))
            } else {
                Ok(())
            }
        };
        match method {
            "strip" | "lstrip" | "rstrip" => {
                too_many(1)?;
                let chars = text_arg(0)?;
                let (left, right) = match method {
                    "lstrip" => (true, false),
                    "rstrip" => (false, true),
                    _ => (true, true),
                };
                return Ok(Value::from(python::strip(s, chars, left, right)));
            }
            "split" => {
                too_many(2)?;
                let sep = text_arg(0)?;
                let maxsplit = match args.get(1) {
                    None => -1,
                    Some(v) => v.as_i64().ok_or_else(|| {
                        Error::new(
                            ErrorKind::InvalidOperation,
                            "split: maxsplit must be an integer",
                        )
                    })?,
                };
                return python::split(s, sep, maxsplit)
                    .map(|parts| parts.into_iter().map(Value::from).collect())
                    .map_err(|e| Error::new(ErrorKind::InvalidOperation, e));
            }
            "splitlines" => {
                too_many(1)?;
                let keepends = args.first().is_some_and(Value::is_true);
                return Ok(python::splitlines(s, keepends)
                    .into_iter()
                    .map(Value::from)
                    .collect());
            }
            "format" => {
                return python::str_format(s, args).map(Value::from);
            }
            _ => {}
        }
    }
    if value.kind() == ValueKind::Map && method == "items" {
        if !args.is_empty() {
            return Err(Error::from(ErrorKind::TooManyArguments));
        }
        return python::into_tuples(&minijinja::filters::items(value)?);
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
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

fn json_kind(v: &Json) -> &'static str {
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
