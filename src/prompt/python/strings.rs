//! Python's string methods where they differ from Rust's and MiniJinja's:
//! Python's whitespace set in `strip`, `split` and `isspace`, its line
//! boundaries in `splitlines`, `islower`/`isupper`, `center`, and jinja2's
//! `indent` and `wordcount` on a string.

/// `str.isspace()` for one character (Python's whitespace set, which has the
/// ASCII separators U+001C..U+001F that Rust's `char::is_whitespace` lacks).
fn is_space(c: char) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
