//! jinja2's filters as transformers' templates see them, where MiniJinja's
//! differ: `tojson` is Python's `json.dumps`, and `join`, `truncate`,
//! `indent`, `round` and `trim` take jinja2's arguments (by position or
//! name) and print values as Python does.

use minijinja::value::{from_args, Kwargs, Rest, Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

use super::python;

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, arguments by position or name.
pub(super) fn tojson(value: &Value, args: Rest<Value>) -> Result<Value, Error> {
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
pub(super) fn join(value: &Value, joiner: Option<Value>, kwargs: Kwargs) -> Result<String, Error> {
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
pub(super) fn truncate(state: &State, value: &Value, args: Rest<Value>) -> Result<Value, Error> {
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
pub(super) fn indent(value: &Value, args: Rest<Value>) -> Result<String, Error> {
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
pub(super) fn round(value: &Value, args: Rest<Value>) -> Result<Value, Error> {
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
pub(super) fn trim(value: &Value, chars: Option<Value>) -> String {
    let s = python::py_str(value);
    let chars = chars.as_ref().and_then(Value::as_str);
    python::strip(&s, chars, true, true).to_owned()
}
