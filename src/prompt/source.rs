//! Rewrites of a template's source so that MiniJinja reads it as jinja2
//! does. The rewrites keep the template's meaning and whitespace control:
//!
//! - line breaks (`\r\n`, `\r`) become `\n`, as jinja2's lexer does first;
//! - string literals are decoded with Python's escape rules (jinja2 runs
//!   them through `unicode-escape`: `\` before a line break continues the
//!   line, `\a`, `\v`, `\U0001F600`, octal escapes, unknown escapes kept)
//!   and written back with escapes MiniJinja reads the same way;
//! - transformers' `{% generation %}` / `{% endgeneration %}` tags, which
//!   only mark assistant spans for training masks, become an always-true
//!   `if` block, which renders its body and trims whitespace like any block.

/// The source MiniJinja should compile for a jinja2 template, or the
/// message of jinja2's syntax error for a bad string escape.
pub fn adapt(source: &str) -> Result<String, String> {
    let source = normalize_newlines(source);
    let mut out = String::with_capacity(source.len());
    let mut rest = source.as_str();
    while let Some(start) = find_tag_start(rest) {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let consumed = match tag.as_bytes()[1] {
            b'#' => tag.find("#}").map_or(tag.len(), |end| end + 2),
            b'%' => {
                if let Some(len) = raw_block_len(tag) {
                    len
                } else if let Some((len, open, end, close)) = generation_tag(tag) {
                    let body = if end { "endif" } else { "if true" };
                    out.push_str(&format!("{{%{open} {body} {close}%}}"));
                    rest = &tag[len..];
                    continue;
                } else {
                    let len = expression_len(tag, "%}");
                    out.push_str(&rewrite_strings(&tag[..len])?);
                    rest = &tag[len..];
                    continue;
                }
            }
            _ => {
                let len = expression_len(tag, "}}");
                out.push_str(&rewrite_strings(&tag[..len])?);
                rest = &tag[len..];
                continue;
            }
        };
        out.push_str(&tag[..consumed]);
        rest = &tag[consumed..];
    }
    out.push_str(rest);
    Ok(out)
}

fn normalize_newlines(source: &str) -> String {
    if !source.contains('\r') {
        return source.to_owned();
    }
    source.replace("\r\n", "\n").replace('\r', "\n")
}

/// Offset of the next `{{`, `{%` or `{#`.
fn find_tag_start(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    (0..bytes.len().saturating_sub(1))
        .find(|&i| bytes[i] == b'{' && matches!(bytes[i + 1], b'{' | b'%' | b'#'))
}

/// The length of a tag's text up to and including its closing delimiter,
/// skipping string literals and bracketed expressions as jinja2 does.
fn expression_len(tag: &str, close: &str) -> usize {
    let bytes = tag.as_bytes();
    let mut depth = 0usize;
    let mut i = 2;
    while i < bytes.len() {
        match bytes[i] {
            q @ (b'\'' | b'"') => i = string_end(bytes, i, q),
            b'(' | b'[' | b'{' => {
                depth += 1;
                i += 1;
            }
            b')' | b']' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'}' | b'%' if depth == 0 && tag[i..].starts_with(close) => return i + close.len(),
            b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            _ => i += 1,
        }
    }
    tag.len()
}

/// Index just past the string literal opened by the quote at `start`.
fn string_end(bytes: &[u8], start: usize, quote: u8) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b if b == quote => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// Rewrites the string literals of one tag that hold escapes.
fn rewrite_strings(tag: &str) -> Result<String, String> {
    if !tag.contains('\\') {
        return Ok(tag.to_owned());
    }
    let bytes = tag.as_bytes();
    let mut out = String::with_capacity(tag.len());
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let q @ (b'\'' | b'"') = bytes[i] {
            let end = string_end(bytes, i, q);
            let body = &tag[i + 1..end.saturating_sub(1).max(i + 1)];
            if body.contains('\\') && end > i + 1 && bytes[end - 1] == q {
                out.push_str(&tag[copied..i]);
                out.push(q as char);
                out.push_str(&escape_for_minijinja(&python_unescape(body)?, q as char));
                out.push(q as char);
                copied = end;
            }
            i = end;
        } else {
            i += 1;
        }
    }
    out.push_str(&tag[copied..]);
    Ok(out)
}

/// Python's `unicode-escape` decoding, as jinja2 applies it to literals.
fn python_unescape(body: &str) -> Result<String, String> {
    let mut out = String::with_capacity(body.len());
    let mut chars = body.chars().peekable();
    let mut pending_high: Option<u32> = None;
    let push = |out: &mut String, code: u32, pending_high: &mut Option<u32>| {
        // Surrogate pairs written as two \u escapes make one character.
        if let Some(high) = pending_high.take() {
            if (0xdc00..0xe000).contains(&code) {
                let c = 0x10000 + ((high - 0xd800) << 10) + (code - 0xdc00);
                out.push(char::from_u32(c).unwrap_or('\u{fffd}'));
                return;
            }
            out.push('\u{fffd}');
        }
        if (0xd800..0xdc00).contains(&code) {
            *pending_high = Some(code);
        } else {
            out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
        }
    };
    while let Some(c) = chars.next() {
        if c != '\\' {
            push(&mut out, c as u32, &mut pending_high);
            continue;
        }
        let Some(d) = chars.next() else {
            return Err("\\ at end of string".into());
        };
        let simple = match d {
            '\n' => Some(None),
            '\\' => Some(Some('\\')),
            '\'' => Some(Some('\'')),
            '"' => Some(Some('"')),
            'a' => Some(Some('\u{07}')),
            'b' => Some(Some('\u{08}')),
            'f' => Some(Some('\u{0c}')),
            'n' => Some(Some('\n')),
            'r' => Some(Some('\r')),
            't' => Some(Some('\t')),
            'v' => Some(Some('\u{0b}')),
            _ => None,
        };
        if let Some(simple) = simple {
            if let Some(ch) = simple {
                push(&mut out, ch as u32, &mut pending_high);
            }
            continue;
        }
        match d {
            '0'..='7' => {
                let mut code = d.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match chars.peek().and_then(|c| c.to_digit(8)) {
                        Some(v) => {
                            code = code * 8 + v;
                            chars.next();
                        }
                        None => break,
                    }
                }
                push(&mut out, code, &mut pending_high);
            }
            'x' | 'u' | 'U' => {
                let (width, name) = match d {
                    'x' => (2, "\\xXX"),
                    'u' => (4, "\\uXXXX"),
                    _ => (8, "\\UXXXXXXXX"),
                };
                let mut code = 0u32;
                for _ in 0..width {
                    match chars.peek().and_then(|c| c.to_digit(16)) {
                        Some(v) => {
                            code = code * 16 + v;
                            chars.next();
                        }
                        None => return Err(format!("truncated {name} escape")),
                    }
                }
                if code > 0x10ffff {
                    return Err("illegal Unicode character".into());
                }
                push(&mut out, code, &mut pending_high);
            }
            other => {
                // Unknown escapes (and \N{...}) stay as written.
                push(&mut out, '\\' as u32, &mut pending_high);
                push(&mut out, other as u32, &mut pending_high);
            }
        }
    }
    if pending_high.is_some() {
        out.push('\u{fffd}');
    }
    Ok(out)
}

/// A string literal body MiniJinja decodes to `value`.
fn escape_for_minijinja(value: &str, quote: char) -> String {
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

/// If `tag` opens a `{% raw %}` block, the length through its `{% endraw %}`.
fn raw_block_len(tag: &str) -> Option<usize> {
    let (len, word) = block_word(tag)?;
    if word != "raw" {
        return None;
    }
    let mut offset = len;
    while let Some(start) = tag[offset..].find("{%") {
        let at = offset + start;
        if let Some((end_len, "endraw")) = block_word(&tag[at..]) {
            return Some(at + end_len);
        }
        offset = at + 2;
    }
    Some(tag.len())
}

/// A block tag holding a single word: its length and the word.
fn block_word(tag: &str) -> Option<(usize, &str)> {
    let inner = tag.strip_prefix("{%")?;
    let inner = inner.strip_prefix(['-', '+']).unwrap_or(inner);
    let trimmed = inner.trim_start();
    let word_len = trimmed
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(trimmed.len());
    let word = &trimmed[..word_len];
    let tail = trimmed[word_len..].trim_start();
    let tail = tail.strip_prefix(['-', '+']).unwrap_or(tail);
    let tail = tail.strip_prefix("%}")?;
    Some((tag.len() - tail.len(), word))
}

/// If `tag` is a generation tag: its length, its whitespace-control marks
/// and whether it closes the block.
fn generation_tag(tag: &str) -> Option<(usize, &str, bool, &str)> {
    let inner = tag.strip_prefix("{%")?;
    let open = if inner.starts_with(['-', '+']) {
        &inner[..1]
    } else {
        ""
    };
    let word_start = inner[open.len()..].trim_start();
    let (end, after) = if let Some(r) = word_start.strip_prefix("endgeneration") {
        (true, r)
    } else if let Some(r) = word_start.strip_prefix("generation") {
        (false, r)
    } else {
        return None;
    };
    if !after.starts_with(|c: char| c.is_whitespace() || matches!(c, '-' | '+' | '%')) {
        // `{% generations %}` is some other tag.
        return None;
    }
    let tail = after.trim_start();
    let close = if tail.starts_with(['-', '+']) {
        &tail[..1]
    } else {
        ""
    };
    let tail = tail[close.len()..].strip_prefix("%}")?;
    Some((tag.len() - tail.len(), open, end, close))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_escapes_are_decoded() {
        assert_eq!(python_unescape("a\\\nb").unwrap(), "ab");
        assert_eq!(
            python_unescape("\\a\\v\\x41\\101\\u00e9\\U0001F600").unwrap(),
            "\u{7}\u{b}AAé😀"
        );
        assert_eq!(
            python_unescape("\\d\\/\\N{BULLET}").unwrap(),
            "\\d\\/\\N{BULLET}"
        );
        assert_eq!(python_unescape("\\ud83d\\ude00").unwrap(), "😀");
        assert!(python_unescape("\\x4").is_err());
    }

    #[test]
    fn literals_are_rewritten_only_inside_tags() {
        let src = "text \\\n{{ 'a\\\nb' + \"c\\/\" }}{# '\\\n' #}{% raw %}{{ '\\\n' }}{% endraw %}";
        assert_eq!(
            adapt(src).unwrap(),
            "text \\\n{{ 'ab' + \"c\\\\/\" }}{# '\\\n' #}{% raw %}{{ '\\\n' }}{% endraw %}"
        );
    }

    #[test]
    fn tag_ends_respect_brackets_and_strings() {
        let src = "{{ {'a': {'b': '}}\\a'}} }}x";
        assert_eq!(adapt(src).unwrap(), "{{ {'a': {'b': '}}\\u0007'}} }}x");
    }

    #[test]
    fn newlines_are_normalized() {
        assert_eq!(adapt("a\r\nb\rc\n").unwrap(), "a\nb\nc\n");
    }

    #[test]
    fn generation_tags_become_if_blocks() {
        assert_eq!(
            adapt("{%- generation -%}x{% endgeneration %}{% generations %}").unwrap(),
            "{%- if true -%}x{% endif %}{% generations %}"
        );
    }
}
