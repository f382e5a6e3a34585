//! Python's `json.dumps`, which transformers' `tojson` filter is: its
//! separators, indentation, key order and float printing, `ensure_ascii`,
//! and its refusals of what JSON cannot hold.

use std::fmt::Write as _;

use minijinja::value::ValueKind;
use minijinja::Value;

use super::repr::{float_repr, map_pairs};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
