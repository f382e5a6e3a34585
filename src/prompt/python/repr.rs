//! Python's `str()` and `repr()` of template values: `None`, `True`,
//! `[1, 'a']`, `{'k': 2.0}`, tuples as `(a, b)`, floats in their shortest
//! round-tripping form, strings quoted and escaped as Python quotes them.

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
pub(super) fn map_pairs(value: &Value) -> Vec<(Value, Value)> {
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
}
