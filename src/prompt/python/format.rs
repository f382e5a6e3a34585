//! Python's formatting of template values: `format % args` (jinja2's
//! `format` filter) and `str.format(...)`, on MiniJinja's implementations
//! with Python's `str()`, `repr()` and `ascii()` of the arguments.

use std::fmt::Write as _;

use minijinja::value::ValueKind;
use minijinja::Value;

use super::repr::{py_str, write_repr};

/// The value `%s` / `{}` should print: Python's `str()` for the values
/// whose Rust display differs (booleans, None, lists, dicts, floats).
fn str_arg(value: &Value) -> Value {
    match value.kind() {
        ValueKind::String => value.clone(),
        ValueKind::Number if value.is_integer() => value.clone(),
        _ => Value::from(py_str(value)),
    }
}

/// `format % args` (jinja2's `format` filter): `%s` prints `str()`, `%r`
/// and `%a` print `repr()`, booleans are integers for numeric conversions.
/// The formatting itself is MiniJinja's printf implementation.
pub fn percent_format(format: &str, args: &[Value]) -> Result<String, minijinja::Error> {
    let mut fmt = String::with_capacity(format.len());
    let mut args: Vec<Value> = args.to_vec();
    let mut next = 0usize;
    let mut chars = format.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        fmt.push(c);
        if c != '%' {
            continue;
        }
        if chars.peek().is_some_and(|(_, c)| *c == '(') {
            // Mapping keys: left to MiniJinja as written.
            continue;
        }
        // flags, width, precision, length modifier, then the conversion.
        while let Some(&(_, d)) = chars.peek() {
            if "-+ #0123456789.hlL".contains(d) {
                fmt.push(d);
                chars.next();
            } else if d == '*' {
                fmt.push(d);
                chars.next();
                next += 1;
            } else {
                break;
            }
        }
        let Some((_, conv)) = chars.next() else {
            break;
        };
        if conv == '%' {
            fmt.push('%');
            continue;
        }
        let arg = args.get(next).cloned();
        match (conv, arg) {
            ('s', Some(arg)) => {
                args[next] = str_arg(&arg);
                fmt.push('s');
            }
            ('r' | 'a', Some(arg)) => {
                let mut text = String::new();
                write_repr(&arg, &mut text);
                if conv == 'a' {
                    text = ascii_escape(&text);
                }
                args[next] = Value::from(text);
                fmt.push('s');
            }
            (_, Some(arg)) if arg.kind() == ValueKind::Bool => {
                args[next] = Value::from(i64::from(arg.is_true()));
                fmt.push(conv);
            }
            _ => fmt.push(conv),
        }
        next += 1;
    }
    minijinja::format_filter(minijinja::FormatStyle::Printf, &fmt, &args)
}

/// `str.format(*args, **kwargs)`: MiniJinja's implementation, with Python's
/// `str()` for booleans, None, lists and dicts.
pub fn str_format(format: &str, args: &[Value]) -> Result<String, minijinja::Error> {
    let args: Vec<Value> = args
        .iter()
        .map(|arg| {
            if arg.is_kwargs() {
                let pairs: Vec<(String, Value)> = arg
                    .try_iter()
                    .map(|keys| {
                        keys.filter_map(|k| {
                            let v = arg.get_item(&k).ok()?;
                            Some((k.as_str()?.to_owned(), str_arg(&v)))
                        })
                        .collect()
                    })
                    .unwrap_or_default();
                Value::from(minijinja::value::Kwargs::from_iter(pairs))
            } else {
                str_arg(arg)
            }
        })
        .collect();
    minijinja::format_filter(minijinja::FormatStyle::StrFormat, format, &args)
}

/// Python's `ascii()` escaping of a repr: non-ASCII as `\xNN`, `\uNNNN`,
/// `\UNNNNNNNN`.
fn ascii_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let u = c as u32;
        let _ = match u {
            0..=0x7f => {
                out.push(c);
                Ok(())
            }
            0x80..=0xff => write!(out, "\\x{u:02x}"),
            0x100..=0xffff => write!(out, "\\u{u:04x}"),
            _ => write!(out, "\\U{u:08x}"),
        };
    }
    out
}
