//! Chat messages, as `POST /v1/chat/completions` and `POST /tokenize` read
//! them: each checked once and given to the template with its content as
//! one string, and the image content parts that a backend may pass through
//! to its upstream's chat route instead.

use serde_json::{Map, Value};

use super::error::ApiError;

/// Roles a chat message may have.
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// The image content parts' types: OpenAI's `image_url`, the Responses
/// API's `input_image`, and `image`, which the gateway takes as a
/// shorthand and forwards as `image_url` ([`forwarded`]).
const IMAGE_PARTS: [&str; 3] = ["image_url", "input_image", "image"];

fn part_type(part: &Value) -> Option<&str> {
    part.get("type").and_then(Value::as_str)
}

/// Checks chat messages and returns them as the template takes them. With
/// `images`, the messages go to an upstream that reads their image parts,
/// so only their text parts are checked (and joined) here.
pub fn messages(messages: &[Value], images: bool) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let obj = m.as_object().ok_or_else(|| {
                ApiError::invalid(&format!("messages[{i}]"), "a message must be an object")
            })?;
            let role = obj.get("role").and_then(Value::as_str).unwrap_or("");
            if !ROLES.contains(&role) {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    format!("role must be one of {}; got `{role}`", ROLES.join(", ")),
                ));
            }
            let mut out: Map<String, Value> = obj.clone();
            let content = obj.get("content").unwrap_or(&Value::Null);
            out.insert("content".into(), flatten_content(content, i, images)?);
            Ok(Value::Object(out))
        })
        .collect()
}

/// A chat message's content as the template sees it: a string. Lists of
/// text parts are joined with newlines; other parts are refused (with
/// `images`, left out, and numbered among the text parts).
fn flatten_content(content: &Value, i: usize, images: bool) -> Result<Value, ApiError> {
    let param = format!("messages[{i}].content");
    match content {
        Value::String(_) => Ok(content.clone()),
        // As vLLM 0.33 reads it for a template that takes text
        // (renderers/chat_utils/chat_message.py: `None` becomes no parts,
        // joined into ""): a message without content, such as an
        // assistant's tool call, has empty content.
        Value::Null => Ok(Value::String(String::new())),
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            let read = parts
                .iter()
                .filter(|p| !images || part_type(p) == Some("text"));
            for (j, part) in read.enumerate() {
                let kind = part_type(part).unwrap_or("");
                match (kind, part.get("text").and_then(Value::as_str)) {
                    ("text", Some(t)) => texts.push(t.to_string()),
                    ("image_url" | "input_image" | "image", _) => {
                        return Err(ApiError::invalid(
                            &format!("{param}[{j}]"),
                            "image content parts are not supported by the MLX backend; the \
                             image route is served through the vLLM backend",
                        ))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("{param}[{j}]"),
                            "a content part must be {\"type\": \"text\", \"text\": \"...\"}",
                        ))
                    }
                }
            }
            Ok(Value::String(texts.join("\n")))
        }
        _ => Err(ApiError::invalid(
            &param,
            "content must be a string or a list of text parts",
        )),
    }
}

/// Where the first image content part is (`messages[i].content[j]`), if
/// any message has one.
pub fn first_image_part(messages: &[Value]) -> Option<String> {
    messages.iter().enumerate().find_map(|(i, m)| {
        let parts = m.get("content")?.as_array()?;
        let j = parts
            .iter()
            .position(|p| part_type(p).is_some_and(|t| IMAGE_PARTS.contains(&t)))?;
        Some(format!("messages[{i}].content[{j}]"))
    })
}

/// The messages as sent, for an upstream's chat route, with every part of
/// type `image` in OpenAI's form ([`image_part`]).
pub fn forwarded(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut messages = messages.to_vec();
    for (i, m) in messages.iter_mut().enumerate() {
        if let Some(parts) = m.get_mut("content").and_then(Value::as_array_mut) {
            for (j, p) in parts.iter_mut().enumerate() {
                *p = image_part(p, &format!("messages[{i}].content[{j}]"))?;
            }
        }
    }
    Ok(messages)
}

/// A content part of type `image` in OpenAI's form, which every upstream
/// chat route takes (vLLM's has no `image` type,
/// `docs/design/vllm.md`): `{"type": "image", "image_url": …}`, `{"type":
/// "image", "image": URL}` and `{"type": "image", "url": URL}` become
/// `{"type": "image_url", "image_url": {"url": URL}}`; other parts are kept.
fn image_part(part: &Value, param: &str) -> Result<Value, ApiError> {
    if part_type(part) != Some("image") {
        return Ok(part.clone());
    }
    let url = match (part.get("image_url"), part.get("image"), part.get("url")) {
        (Some(Value::Object(o)), _, _) => o.get("url").and_then(Value::as_str),
        (Some(Value::String(u)), _, _) | (None, Some(Value::String(u)), _) => Some(u.as_str()),
        (None, None, Some(Value::String(u))) => Some(u.as_str()),
        _ => None,
    };
    let url = url.ok_or_else(|| {
        ApiError::invalid(
            param,
            "an `image` part needs its image as `image_url` ({\"url\": URL} or URL), `image` \
             (URL) or `url` (URL); or send {\"type\": \"image_url\", \"image_url\": {\"url\": \
             URL}}",
        )
    })?;
    Ok(serde_json::json!({"type": "image_url", "image_url": {"url": url}}))
}
