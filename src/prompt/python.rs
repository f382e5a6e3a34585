//! Python semantics that chat templates rely on.
//!
//! Hugging Face chat templates are written for Python's jinja2, so what they
//! print follows Python: `str(None)` is `None`, `str([1, 'a'])` is
//! `[1, 'a']`, `str.strip()` strips Python's whitespace set, `tojson` is
//! `json.dumps`. MiniJinja follows Rust conventions instead; the helpers here
//! restore Python's behaviour where it changes the rendered bytes.

use std::fmt::Write as _;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr, ValueKind};
use minijinja::Value;

/// A Python tuple: iterates and indexes like a list, prints as `(a, b)`.
/// `dict.items()`, `|items` and `|dictsort` yield these.
#[derive(Debug)]
pub struct Tuple(pub Vec<Value>);

impl Object for Tuple {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let index = key.as_i64()?;
        let index = if index < 0 {
            self.0.len().checked_sub(index.unsigned_abs() as usize)?
        } else {
            index as usize
        };
        self.0.get(index).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.0.len())
    }
}

/// Turns a sequence of pairs into a list of tuples.
pub fn into_tuples(pairs: &Value) -> Result<Value, minijinja::Error> {
    let mut out = Vec::new();
    for pair in pairs.try_iter()? {
        let items: Vec<Value> = pair.try_iter()?.collect();
        out.push(Value::from_object(Tuple(items)));
    }
    Ok(Value::from(out))
}

/// `str.isspace()` for one character (Python's whitespace set, which has the
/// ASCII separators U+001C..U+001F that Rust's `char::is_whitespace` lacks).
pub fn is_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n'
            | '\u{0b}'
            | '\u{0c}'
            | '\r'
            | '\u{1c}'..='\u{1f}'
            | ' '
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}

/// `str.islower()`: at least one cased character, none of them uppercase.
pub fn is_lower(s: &str) -> bool {
    s.chars().any(char::is_lowercase) && !s.chars().any(char::is_uppercase)
}

/// `str.isupper()`: at least one cased character, none of them lowercase.
pub fn is_upper(s: &str) -> bool {
    s.chars().any(char::is_uppercase) && !s.chars().any(char::is_lowercase)
}

/// jinja2's `indent` on a string, quirks included: a newline is appended
/// before splitting the lines, so a trailing line break keeps its indent.
pub fn indent(s: &str, indentation: &str, first: bool, blank: bool) -> String {
    let lines = splitlines(&format!("{s}\n"), false);
    let mut out = if blank {
        lines.join(&format!("\n{indentation}"))
    } else {
        let mut rest = lines.iter();
        let mut out = rest.next().cloned().unwrap_or_default();
        let tail: Vec<String> = rest
            .map(|line| {
                if line.is_empty() {
                    String::new()
                } else {
                    format!("{indentation}{line}")
                }
            })
            .collect();
        if !tail.is_empty() {
            out.push('\n');
            out.push_str(&tail.join("\n"));
        }
        out
    };
    if first {
        out.insert_str(0, indentation);
    }
    out
}

/// `str.center(width)`, which puts the odd space on the right unless both
/// the padding and the width are odd.
pub fn center(s: &str, width: usize) -> String {
    let len = s.chars().count();
    if width <= len {
        return s.to_owned();
    }
    let pad = width - len;
    let left = pad / 2 + (pad & width & 1);
    format!("{}{s}{}", " ".repeat(left), " ".repeat(pad - left))
}

/// jinja2's `wordcount`: the number of `\w+` runs.
pub fn wordcount(s: &str) -> usize {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    s.split(|c: char| !is_word(c))
        .filter(|w| !w.is_empty())
        .count()
}

/// `str.strip(chars)`, `str.lstrip(chars)`, `str.rstrip(chars)`: with no
/// `chars`, Python's whitespace is stripped.
pub fn strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let drop = |c: char| match chars {
        Some(set) => set.contains(c),
        None => is_space(c),
    };
    let mut out = s;
    if left {
        out = out.trim_start_matches(drop);
    }
    if right {
        out = out.trim_end_matches(drop);
    }
    out
}

/// `str.split(sep, maxsplit)`. `sep = None` splits on runs of whitespace and
/// drops empty pieces at both ends, as Python does. An empty separator is an
/// error in Python and here.
pub fn split(s: &str, sep: Option<&str>, maxsplit: i64) -> Result<Vec<String>, &'static str> {
    let limit = usize::try_from(maxsplit).ok();
    match sep {
        Some("") => Err("empty separator"),
        Some(sep) => Ok(match limit {
            Some(n) => s.splitn(n + 1, sep).map(str::to_owned).collect(),
            None => s.split(sep).map(str::to_owned).collect(),
        }),
        None => {
            let mut parts = Vec::new();
            let mut rest = s.trim_start_matches(is_space);
            while !rest.is_empty() {
                if limit.is_some_and(|n| parts.len() == n) {
                    // Python keeps the remainder as is, trailing whitespace included.
                    parts.push(rest.to_owned());
                    break;
                }
                let end = rest.find(is_space).unwrap_or(rest.len());
                parts.push(rest[..end].to_owned());
                rest = rest[end..].trim_start_matches(is_space);
            }
            Ok(parts)
        }
    }
}

/// `str.splitlines(keepends)` with Python's set of line boundaries.
pub fn splitlines(s: &str, keepends: bool) -> Vec<String> {
    let is_break = |c: char| {
        matches!(
            c,
            '\n' | '\r'
                | '\u{0b}'
                | '\u{0c}'
                | '\u{1c}'
                | '\u{1d}'
                | '\u{1e}'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        )
    };
    let mut lines = Vec::new();
    let mut rest = s;
    while let Some(pos) = rest.find(is_break) {
        let c = rest[pos..].chars().next().unwrap_or('\n');
        let mut end = pos + c.len_utf8();
        if c == '\r' && rest[end..].starts_with('\n') {
            end += 1;
        }
        lines.push(rest[..if keepends { end } else { pos }].to_owned());
        rest = &rest[end..];
    }
    if !rest.is_empty() {
        lines.push(rest.to_owned());
    }
    lines
}

/// `repr(float)` (which is also `str(float)` and what `json.dumps` writes):
/// the shortest digits that round-trip, in exponent form when the decimal
/// exponent is below -4 or at least 16.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as Python's repr.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    // Python's `decpt`: the value is 0.DIGITS x 10^decpt.
    let decpt = exp + 1;
    let body = if !(-4 < decpt && decpt <= 16) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{first}{frac}e{esign}{:02}", exp.unsigned_abs())
    } else if decpt <= 0 {
        format!("0.{}{digits}", "0".repeat(decpt.unsigned_abs() as usize))
    } else {
        let decpt = decpt as usize;
        if decpt >= digits.len() {
            format!("{digits}{}.0", "0".repeat(decpt - digits.len()))
        } else {
            format!("{}.{}", &digits[..decpt], &digits[decpt..])
        }
    };
    format!("{sign}{body}")
}

/// Whether Python's `str.isprintable()` holds for `c`. Python consults the
/// full Unicode database; this covers the control, format, separator and
/// private-use ranges that occur in practice (unassigned code points are
/// treated as printable).
fn is_printable(c: char) -> bool {
    let u = c as u32;
    !matches!(u,
        0x00..=0x1f
        | 0x7f..=0xa0
        | 0xad
        | 0x600..=0x605
        | 0x61c
        | 0x6dd
        | 0x70f
        | 0x890..=0x891
        | 0x8e2
        | 0x180e
        | 0x1680
        | 0x2000..=0x200f
        | 0x2028..=0x202f
        | 0x205f..=0x2064
        | 0x2066..=0x206f
        | 0x3000
        | 0xe000..=0xf8ff
        | 0xfeff
        | 0xfff9..=0xfffb
        | 0x110bd
        | 0x110cd
        | 0x13430..=0x1343f
        | 0x1bca0..=0x1bca3
        | 0x1d173..=0x1d17a
        | 0xe0001
        | 0xe0020..=0xe007f
        | 0xf0000..=0x10ffff
    )
}

/// `repr(str)`: single quotes unless the text has a single quote and no
/// double quote; non-printable characters escaped as `\xNN`, `\uNNNN` or
/// `\UNNNNNNNN`.
pub fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c => {
                let u = c as u32;
                let _ = if u < 0x100 {
                    write!(out, "\\x{u:02x}")
                } else if u < 0x10000 {
                    write!(out, "\\u{u:04x}")
                } else {
                    write!(out, "\\U{u:08x}")
                };
            }
        }
    }
    out.push(quote);
    out
}

/// The key/value pairs of a map value, in its order.
fn map_pairs(value: &Value) -> Vec<(Value, Value)> {
    match value.try_iter() {
        Ok(keys) => keys
            .map(|k| {
                let v = value.get_item(&k).unwrap_or_default();
                (k, v)
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// `str(value)` as Python prints a template value.
pub fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::String => value.as_str().unwrap_or_default().to_owned(),
        ValueKind::Undefined => String::new(),
        _ => {
            let mut out = String::new();
            write_repr(value, &mut out);
            out
        }
    }
}

/// `repr(value)` as Python would write it for the JSON-like values that
/// templates see.
pub fn write_repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => {
            if value.is_integer() {
                let _ = write!(out, "{value}");
            } else {
                out.push_str(&float_repr(
                    f64::try_from(value.clone()).unwrap_or(f64::NAN),
                ));
            }
        }
        ValueKind::String => out.push_str(&str_repr(value.as_str().unwrap_or_default())),
        ValueKind::Seq | ValueKind::Iterable => {
            let tuple = value.downcast_object_ref::<Tuple>().is_some();
            out.push(if tuple { '(' } else { '[' });
            let mut count = 0;
            if let Ok(items) = value.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(&item, out);
                    count += 1;
                }
            }
            if tuple && count == 1 {
                out.push(',');
            }
            out.push(if tuple { ')' } else { ']' });
        }
        ValueKind::Map => {
            out.push('{');
            for (i, (k, v)) in map_pairs(value).iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(k, out);
                out.push_str(": ");
                write_repr(v, out);
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

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

/// Options of transformers' `tojson` filter, which is
/// `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
#[derive(Debug, Clone, Default)]
pub struct JsonOptions {
    pub ensure_ascii: bool,
    /// The indent string (`json.dumps` turns an integer `n` into `n` spaces).
    pub indent: Option<String>,
    /// `(item_separator, key_separator)`.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

/// `json.dumps(value, ...)`. Fails, as Python does, on values JSON cannot
/// hold (undefined, bytes, callables) and on keys that are not scalars.
pub fn json_dumps(value: &Value, opts: &JsonOptions) -> Result<String, String> {
    let (item_sep, key_sep) = match (&opts.separators, &opts.indent) {
        (Some((i, k)), _) => (i.clone(), k.clone()),
        (None, Some(_)) => (",".to_owned(), ": ".to_owned()),
        (None, None) => (", ".to_owned(), ": ".to_owned()),
    };
    let mut out = String::new();
    let enc = JsonEncoder {
        opts,
        item_sep,
        key_sep,
    };
    enc.write(value, 0, &mut out)?;
    Ok(out)
}

struct JsonEncoder<'a> {
    opts: &'a JsonOptions,
    item_sep: String,
    key_sep: String,
}

impl JsonEncoder<'_> {
    fn write(&self, value: &Value, level: usize, out: &mut String) -> Result<(), String> {
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&self.number(value)),
            ValueKind::String => self.string(value.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter().map_err(|e| e.to_string())?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                let (sep, close) = self.layout(level);
                out.push_str(&sep[self.item_sep.len()..]);
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&sep);
                    }
                    self.write(item, level + 1, out)?;
                }
                out.push_str(&close);
                out.push(']');
            }
            ValueKind::Map => {
                let mut pairs = Vec::new();
                for (k, v) in map_pairs(value) {
                    pairs.push((self.key(&k)?, v));
                }
                if self.opts.sort_keys {
                    pairs.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if pairs.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                let (sep, close) = self.layout(level);
                out.push_str(&sep[self.item_sep.len()..]);
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&sep);
                    }
                    self.string(k, out);
                    out.push_str(&self.key_sep);
                    self.write(v, level + 1, out)?;
                }
                out.push_str(&close);
                out.push('}');
            }
            ValueKind::Undefined => {
                return Err("Object of type Undefined is not JSON serializable".into())
            }
            kind => return Err(format!("Object of type {kind} is not JSON serializable")),
        }
        Ok(())
    }

    /// The separator between items (item separator, then the newline and
    /// indent when indenting) and what goes before the closing bracket.
    fn layout(&self, level: usize) -> (String, String) {
        match &self.opts.indent {
            Some(indent) => (
                format!("{}\n{}", self.item_sep, indent.repeat(level + 1)),
                format!("\n{}", indent.repeat(level)),
            ),
            None => (self.item_sep.clone(), String::new()),
        }
    }

    fn number(&self, value: &Value) -> String {
        if value.is_integer() {
            return value.to_string();
        }
        let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
        if f.is_nan() {
            "NaN".into()
        } else if f.is_infinite() {
            if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
        } else {
            float_repr(f)
        }
    }

    /// A key as `json.dumps` converts it: strings as is, numbers, booleans
    /// and None to their JSON text.
    fn key(&self, key: &Value) -> Result<String, String> {
        match key.kind() {
            ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
            ValueKind::Number => Ok(self.number(key)),
            ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
            ValueKind::None => Ok("null".into()),
            kind => Err(format!(
                "keys must be str, int, float, bool or None, not {kind}"
            )),
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.opts.ensure_ascii && !(' '..='~').contains(&c)) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{:04x}", unit);
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A moment in civil time, the fields `strftime` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CivilTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub microsecond: u32,
}

impl CivilTime {
    /// UTC civil time of a Unix timestamp (seconds and microseconds).
    pub fn from_unix(secs: i64, micros: u32) -> CivilTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        // Howard Hinnant's days-to-civil algorithm.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        CivilTime {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
            microsecond: micros,
        }
    }

    /// The current time in UTC.
    pub fn now_utc() -> CivilTime {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        CivilTime::from_unix(now.as_secs() as i64, now.subsec_micros())
    }

    fn is_leap(&self) -> bool {
        (self.year % 4 == 0 && self.year % 100 != 0) || self.year % 400 == 0
    }

    /// Day of the year, 1..=366.
    fn yday(&self) -> u32 {
        const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        BEFORE[(self.month - 1) as usize] + self.day + u32::from(self.month > 2 && self.is_leap())
    }

    /// Day of the week, 0 = Sunday (C's `tm_wday`).
    fn wday(&self) -> u32 {
        // Zeller-like: 1970-01-01 was a Thursday.
        let (y, m) = if self.month <= 2 {
            (self.year - 1, self.month + 12)
        } else {
            (self.year, self.month)
        };
        let k = y.rem_euclid(100);
        let j = y.div_euclid(100);
        let h = (i64::from(self.day) + (13 * (i64::from(m) + 1)) / 5 + k + k / 4 + j / 4 + 5 * j)
            .rem_euclid(7);
        // h: 0 = Saturday
        ((h + 6) % 7) as u32
    }
}

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// `datetime.strftime(format)` in the C locale for a UTC time, with glibc's
/// `-` (no padding) flag. Unknown directives are kept as written, as glibc
/// does.
pub fn strftime(t: &CivilTime, format: &str) -> String {
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let Some(d) = chars.next() else {
            out.push('%');
            if no_pad {
                out.push('-');
            }
            break;
        };
        let num = |n: u32, width: usize, pad: char| -> String {
            if no_pad {
                n.to_string()
            } else if pad == ' ' {
                format!("{n:>width$}")
            } else {
                format!("{n:0width$}")
            }
        };
        let hour12 = if t.hour.is_multiple_of(12) {
            12
        } else {
            t.hour % 12
        };
        let wday = t.wday();
        let piece = match d {
            'a' => DAYS[wday as usize][..3].to_owned(),
            'A' => DAYS[wday as usize].to_owned(),
            'b' | 'h' => MONTHS[(t.month - 1) as usize][..3].to_owned(),
            'B' => MONTHS[(t.month - 1) as usize].to_owned(),
            'c' => format!(
                "{} {} {:>2} {:02}:{:02}:{:02} {}",
                &DAYS[wday as usize][..3],
                &MONTHS[(t.month - 1) as usize][..3],
                t.day,
                t.hour,
                t.minute,
                t.second,
                t.year
            ),
            'C' => num((t.year / 100) as u32, 2, '0'),
            'd' => num(t.day, 2, '0'),
            'D' | 'x' => format!("{:02}/{:02}/{:02}", t.month, t.day, t.year.rem_euclid(100)),
            'e' => num(t.day, 2, ' '),
            'f' => format!("{:06}", t.microsecond),
            'F' => format!("{}-{:02}-{:02}", t.year, t.month, t.day),
            'H' => num(t.hour, 2, '0'),
            'I' => num(hour12, 2, '0'),
            'j' => num(t.yday(), 3, '0'),
            'k' => num(t.hour, 2, ' '),
            'l' => num(hour12, 2, ' '),
            'm' => num(t.month, 2, '0'),
            'M' => num(t.minute, 2, '0'),
            'n' => "\n".to_owned(),
            'p' => if t.hour < 12 { "AM" } else { "PM" }.to_owned(),
            'R' => format!("{:02}:{:02}", t.hour, t.minute),
            'S' => num(t.second, 2, '0'),
            't' => "\t".to_owned(),
            'T' | 'X' => format!("{:02}:{:02}:{:02}", t.hour, t.minute, t.second),
            'u' => (if wday == 0 { 7 } else { wday }).to_string(),
            'w' => wday.to_string(),
            'U' => num((t.yday() + 6 - wday) / 7, 2, '0'),
            'W' => num((t.yday() + 6 - (wday + 6) % 7) / 7, 2, '0'),
            'y' => num(t.year.rem_euclid(100) as u32, 2, '0'),
            'Y' => t.year.to_string(),
            'z' => "+0000".to_owned(),
            'Z' => "UTC".to_owned(),
            '%' => "%".to_owned(),
            other => {
                let mut kept = String::from('%');
                if no_pad {
                    kept.push('-');
                }
                kept.push(other);
                kept
            }
        };
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python() {
        let cases = [
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (-0.0, "-0.0"),
            (1.5e300, "1.5e+300"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (100.0, "100.0"),
            (-3.25e-7, "-3.25e-07"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn strings_repr_like_python() {
        assert_eq!(str_repr("it's"), "\"it's\"");
        assert_eq!(str_repr("a\"b"), "'a\"b'");
        assert_eq!(str_repr("both'\""), "'both\\'\"'");
        assert_eq!(
            str_repr("\n\u{1}é\u{7f}\u{200b}"),
            "'\\n\\x01é\\x7f\\u200b'"
        );
    }

    #[test]
    fn whitespace_split_and_strip_follow_python() {
        assert_eq!(strip("\u{1f} a \u{3000}", None, true, true), "a");
        assert_eq!(strip("xxaxx", Some("x"), true, false), "axx");
        assert_eq!(split("  a  b c ", None, -1).unwrap(), ["a", "b", "c"]);
        assert_eq!(split("  a  b c ", None, 1).unwrap(), ["a", "b c "]);
        assert_eq!(split("a,b,,c", Some(","), -1).unwrap(), ["a", "b", "", "c"]);
        assert_eq!(split("a,b,,c", Some(","), 1).unwrap(), ["a", "b,,c"]);
        assert!(split("a", Some(""), -1).is_err());
        assert_eq!(splitlines("a\r\nb\rc\n", false), ["a", "b", "c"]);
        assert_eq!(
            splitlines("a\r\nb\u{2028}c", true),
            ["a\r\n", "b\u{2028}", "c"]
        );
    }

    #[test]
    fn json_dumps_matches_python() {
        let v = Value::from_serialize(serde_json::json!({
            "a": [1, 2.0, null, true, "é\u{1f}"],
            "b": {}
        }));
        let opts = JsonOptions::default();
        assert_eq!(
            json_dumps(&v, &opts).unwrap(),
            "{\"a\": [1, 2.0, null, true, \"é\\u001f\"], \"b\": {}}"
        );
        let v = Value::from_serialize(serde_json::json!({"a": [1, {}, []], "b": "x"}));
        let opts = JsonOptions {
            indent: Some("  ".into()),
            ..Default::default()
        };
        assert_eq!(
            json_dumps(&v, &opts).unwrap(),
            "{\n  \"a\": [\n    1,\n    {},\n    []\n  ],\n  \"b\": \"x\"\n}"
        );
        let opts = JsonOptions {
            ensure_ascii: true,
            ..Default::default()
        };
        assert_eq!(
            json_dumps(&Value::from("é😀"), &opts).unwrap(),
            "\"\\u00e9\\ud83d\\ude00\""
        );
    }

    #[test]
    fn strftime_matches_python_in_c_locale() {
        // 2024-02-29 07:05:09.012345 UTC, a Thursday.
        let t = CivilTime::from_unix(1_709_190_309, 12_345);
        assert_eq!(
            t,
            CivilTime {
                year: 2024,
                month: 2,
                day: 29,
                hour: 7,
                minute: 5,
                second: 9,
                microsecond: 12_345
            }
        );
        // Expected strings from Python's datetime(2024, 2, 29, 7, 5, 9, 12345).strftime(...).
        assert_eq!(strftime(&t, "%d %b %Y"), "29 Feb 2024");
        assert_eq!(
            strftime(&t, "%A, %B %-d, %Y"),
            "Thursday, February 29, 2024"
        );
        assert_eq!(
            strftime(&t, "%Y-%m-%d %H:%M:%S.%f"),
            "2024-02-29 07:05:09.012345"
        );
        assert_eq!(
            strftime(&t, "%I %p %j %a %y %e %w %u"),
            "07 AM 060 Thu 24 29 4 4"
        );
        assert_eq!(
            strftime(&t, "%U %W %c %%"),
            "08 09 Thu Feb 29 07:05:09 2024 %"
        );
    }
}
