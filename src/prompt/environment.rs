//! The environment transformers renders chat templates in: `trim_blocks`,
//! `lstrip_blocks`, no autoescape, loop controls, its globals
//! (`raise_exception`, `strftime_now`), jinja2's tests with Python's types,
//! and Python's printing and methods on template values.

use std::fmt;

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, UndefinedBehavior};

use super::filters::{indent, join, round, tojson, trim, truncate};
use super::python;

/// The environment transformers builds: `trim_blocks`, `lstrip_blocks`, no
/// autoescape, `loopcontrols`, its `tojson`, `raise_exception` and
/// `strftime_now`, plus Python's printing and string methods.
pub(super) fn environment() -> Environment<'static> {
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
pub(super) struct RaisedByTemplate(pub(super) String);

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
