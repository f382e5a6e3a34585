//! Prompt building against the Python reference: every chat template
//! rendering must equal transformers' byte for byte, and every token id list
//! must equal Python `tokenizers`'.
//!
//! The reference comes from `scripts/reference/prompts.py` and is read from
//! `$DECISIO_REFERENCE_DIR/prompts.json` (default: `target/reference/` in the
//! crate). Each template folder it lists is loaded from the same path here, so
//! adding a model means passing one more folder to the script.

use std::path::{Path, PathBuf};

use decisio::prompt::{ChatTemplate, PromptError, TextTokenizer};
use serde_json::{Map, Value};

const HOW_TO_GENERATE: &str = "generate it with\n    \
    python scripts/reference/prompts.py target/reference <template folders>\n\
    in the project's venv (with no folders it uses those that exist of $DECISIO_ASSETS/qwen3, \
    $DECISIO_ASSETS/gemma3, $DECISIO_CACHE/models/smollm2-135m-instruct and \
    tests/fixtures/chat-templates/pycompat), or point DECISIO_REFERENCE_DIR at a folder \
    holding prompts.json";

/// How many mismatches are printed in full (`DECISIO_CONFORMANCE_SHOW` to change).
fn shown() -> usize {
    std::env::var("DECISIO_CONFORMANCE_SHOW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

fn reference() -> Value {
    let dir = std::env::var_os("DECISIO_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/reference"));
    let path = dir.join("prompts.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "the prompt reference {} is missing ({e});\n{HOW_TO_GENERATE}",
            path.display()
        )
    });
    let reference: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "the prompt reference {} is not valid JSON ({e});\n{HOW_TO_GENERATE}",
            path.display()
        )
    });
    let folders = reference["folders"].as_array().map_or(0, Vec::len);
    assert!(
        folders > 0,
        "the prompt reference {} lists no template folders;\n{HOW_TO_GENERATE}",
        path.display()
    );
    reference
}

fn folders(reference: &Value) -> impl Iterator<Item = &Value> {
    reference["folders"].as_array().into_iter().flatten()
}

fn folder_path(folder: &Value) -> PathBuf {
    let path = PathBuf::from(folder["path"].as_str().unwrap_or_default());
    assert!(
        path.is_dir(),
        "template folder {} from the reference does not exist here;\n{HOW_TO_GENERATE}",
        path.display()
    );
    path
}

fn name(folder: &Value) -> &str {
    folder["name"].as_str().unwrap_or("?")
}

/// Where two strings first differ, with the text around it on both sides.
fn string_difference(want: &str, got: &str) -> String {
    let at = want
        .char_indices()
        .zip(got.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| want.len().min(got.len()));
    let line = want[..at].matches('\n').count() + 1;
    let context = |s: &str| {
        let start = s[..at.min(s.len())]
            .char_indices()
            .rev()
            .nth(40)
            .map_or(0, |(i, _)| i);
        let tail: String = s[at.min(s.len())..].chars().take(40).collect();
        format!(
            "{}⟦{}",
            s[start..at.min(s.len())].escape_debug(),
            tail.escape_debug()
        )
    };
    format!(
        "first difference at byte {at} (line {line}; lengths {} vs {}):\n      python: …{}…\n      rust:   …{}…",
        want.len(),
        got.len(),
        context(want),
        context(got)
    )
}

/// Where two id lists first differ, with the tokens around it.
fn ids_difference(tok: &TextTokenizer, want: &[u32], got: &[u32]) -> String {
    let at = want
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| want.len().min(got.len()));
    let show = |ids: &[u32]| {
        let lo = at.saturating_sub(3);
        let hi = (at + 4).min(ids.len());
        ids[lo.min(hi)..hi]
            .iter()
            .map(|&id| format!("{id}:{:?}", tok.id_to_token(id).unwrap_or_default()))
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        "first difference at token {at} (lengths {} vs {}):\n      python: {}\n      rust:   {}",
        want.len(),
        got.len(),
        show(want),
        show(got)
    )
}

#[derive(Default)]
struct Report {
    checked: usize,
    failures: Vec<String>,
}

impl Report {
    fn check(&mut self, ok: bool, failure: impl FnOnce() -> String) {
        self.checked += 1;
        if !ok {
            self.failures.push(failure());
        }
    }

    fn finish(self, what: &str) {
        println!(
            "{what}: {} compared, {} different",
            self.checked,
            self.failures.len()
        );
        if self.failures.is_empty() {
            return;
        }
        let count = self.failures.len().min(shown());
        let shown = self.failures[..count].join("\n\n");
        panic!(
            "{} of {} {what} differ from the Python reference; the first {}:\n\n{shown}",
            self.failures.len(),
            self.checked,
            count
        );
    }
}

#[test]
fn chat_templates_render_like_transformers() {
    let reference = reference();
    let mut report = Report::default();
    let mut metadata = Report::default();
    for folder in folders(&reference) {
        let path = folder_path(folder);
        let template = ChatTemplate::from_tokenizer_config(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));

        let want_thinking = folder["supports_enable_thinking"]
            .as_bool()
            .unwrap_or(false);
        metadata.check(template.supports_enable_thinking() == want_thinking, || {
            format!(
                "{}: supports_enable_thinking() is {}, the reference says {want_thinking}",
                name(folder),
                !want_thinking
            )
        });
        // Special tokens the template reads must have transformers' values.
        if let Some(tokens) = folder["special_tokens"].as_object() {
            for (token_name, value) in tokens {
                if !template.supports(token_name) {
                    continue;
                }
                let ours = template
                    .special_tokens()
                    .iter()
                    .find(|(n, _)| n == token_name)
                    .map(|(_, v)| v.as_str());
                metadata.check(ours == value.as_str(), || {
                    format!(
                        "{}: special token {token_name} is {ours:?}, transformers has {value}",
                        name(folder)
                    )
                });
            }
        }

        for case in folder["renderings"].as_array().into_iter().flatten() {
            let label = format!(
                "{}/{} add_generation_prompt={} kwargs={}",
                name(folder),
                case["case"].as_str().unwrap_or("?"),
                case["add_generation_prompt"],
                Value::Object(
                    case["kwargs"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .filter(|(k, _)| *k != "tools")
                                .map(|(k, v)| (k.clone(), v.clone()))
                                .collect()
                        })
                        .unwrap_or_default()
                )
            );
            let messages = case["messages"].as_array().cloned().unwrap_or_default();
            let kwargs: Map<String, Value> =
                case["kwargs"].as_object().cloned().unwrap_or_default();
            let agp = case["add_generation_prompt"].as_bool().unwrap_or(false);
            let got = template.render(&messages, agp, &kwargs);
            match (&case["text"], &case["error"], got) {
                (Value::String(want), _, Ok(got)) => report.check(*want == got, || {
                    format!("{label}: {}", string_difference(want, &got))
                }),
                (Value::String(_), _, Err(e)) => report.check(false, || {
                    format!("{label}: transformers renders it, rust fails: {e}")
                }),
                (_, Value::Object(err), got) => {
                    let raised = err.get("raised").and_then(Value::as_bool).unwrap_or(false);
                    let message = err
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    match got {
                        Err(PromptError::TemplateRaised { message: ours }) if raised => {
                            report.check(ours == message, || {
                                format!("{label}: raise_exception message {ours:?}, transformers {message:?}")
                            })
                        }
                        Err(e) if !raised && !matches!(e, PromptError::TemplateRaised { .. }) => {
                            report.check(true, String::new)
                        }
                        Err(e) => report.check(false, || {
                            format!("{label}: transformers fails with {err:?}, rust fails differently: {e:?}")
                        }),
                        Ok(text) => report.check(false, || {
                            format!(
                                "{label}: transformers fails with {} ({message}), rust renders {:?}",
                                err.get("type").and_then(Value::as_str).unwrap_or("?"),
                                text
                            )
                        }),
                    }
                }
                _ => panic!("{label}: reference entry has neither text nor error"),
            }
        }
    }
    metadata.finish("template properties (enable_thinking support, special tokens)");
    report.finish("renderings");
}

/// The tokenizers of the reference's folders that have one.
fn tokenizers(reference: &Value) -> Vec<(&Value, TextTokenizer)> {
    folders(reference)
        .filter(|f| f["tokenized"].as_array().is_some_and(|t| !t.is_empty()))
        .map(|f| {
            let path = folder_path(f).join("tokenizer.json");
            let tok = TextTokenizer::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
            (f, tok)
        })
        .collect()
}

fn ids(v: &Value) -> Option<Vec<u32>> {
    v.as_array().map(|a| {
        a.iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .expect("token id")
            })
            .collect()
    })
}

#[test]
fn tokenizers_encode_and_decode_like_python() {
    let reference = reference();
    let mut encoded = Report::default();
    let mut decoded = Report::default();
    for (folder, tok) in tokenizers(&reference) {
        for entry in folder["tokenized"].as_array().into_iter().flatten() {
            let label = format!(
                "{}/{}",
                name(folder),
                entry["label"].as_str().unwrap_or("?")
            );
            let text = entry["text"].as_str().unwrap_or_default();
            let want = ids(&entry["ids"]).expect("ids");
            let got = tok
                .encode(text, false)
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            encoded.check(got == want, || {
                format!(
                    "{label} (add_special_tokens=false): {}",
                    ids_difference(&tok, &want, &got)
                )
            });
            let want_special = ids(&entry["ids_with_special"]).unwrap_or_else(|| want.clone());
            let got = tok
                .encode(text, true)
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            encoded.check(got == want_special, || {
                format!(
                    "{label} (add_special_tokens=true): {}",
                    ids_difference(&tok, &want_special, &got)
                )
            });

            let want_text = entry["decoded"].as_str().unwrap_or(text);
            let got = tok
                .decode(&want, false)
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            decoded.check(got == want_text, || {
                format!("{label} decode: {}", string_difference(want_text, &got))
            });
            let want_skip = entry["decoded_skip_special"].as_str().unwrap_or(want_text);
            let got = tok
                .decode(&want, true)
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            decoded.check(got == want_skip, || {
                format!(
                    "{label} decode(skip_special_tokens): {}",
                    string_difference(want_skip, &got)
                )
            });
        }
    }
    encoded.finish("token id lists");
    decoded.finish("decodings");
}

/// The pieces an incremental decoder emits for `ids`, the final flush included.
fn stream(tok: &TextTokenizer, ids: &[u32], skip_special_tokens: bool, label: &str) -> Vec<String> {
    let mut stream = tok.incremental(skip_special_tokens);
    let mut pieces = Vec::new();
    for &id in ids {
        if let Some(piece) = stream.push(id).unwrap_or_else(|e| panic!("{label}: {e}")) {
            pieces.push(piece);
        }
    }
    pieces.extend(stream.finish().unwrap_or_else(|e| panic!("{label}: {e}")));
    pieces
}

#[test]
fn streaming_and_token_bytes_agree_with_decode() {
    let reference = reference();
    let mut report = Report::default();
    for (folder, tok) in tokenizers(&reference) {
        for entry in folder["tokenized"].as_array().into_iter().flatten() {
            let label = format!(
                "{}/{}",
                name(folder),
                entry["label"].as_str().unwrap_or("?")
            );
            let ids = ids(&entry["ids"]).expect("ids");
            let text = entry["decoded"]
                .as_str()
                .unwrap_or_else(|| entry["text"].as_str().unwrap_or_default());

            // Streaming: the pieces concatenate to the full decoding and never
            // hold a replacement character the full text does not have.
            let pieces = stream(&tok, &ids, false, &label);
            let streamed = pieces.concat();
            report.check(streamed == text, || {
                format!("{label} streamed: {}", string_difference(text, &streamed))
            });
            let skipped_text = entry["decoded_skip_special"].as_str().unwrap_or(text);
            let skipped = stream(&tok, &ids, true, &label).concat();
            report.check(skipped == skipped_text, || {
                format!(
                    "{label} streamed (skip_special_tokens): {}",
                    string_difference(skipped_text, &skipped)
                )
            });
            if !text.contains('\u{FFFD}') {
                report.check(!pieces.iter().any(|p| p.contains('\u{FFFD}')), || {
                    format!("{label}: a streamed piece holds U+FFFD: {pieces:?}")
                });
                // Token bytes: concatenated, they are the decoded text.
                let bytes: Vec<u8> = ids
                    .iter()
                    .flat_map(|&id| tok.token_bytes(id).expect("known id"))
                    .collect();
                report.check(bytes == text.as_bytes(), || {
                    format!(
                        "{label} token bytes: {}",
                        string_difference(text, &String::from_utf8_lossy(&bytes))
                    )
                });
            }
        }
    }
    report.finish("streamed decodings and token byte sequences");
}

#[test]
fn vocabularies_match_python() {
    let reference = reference();
    let mut report = Report::default();
    for (folder, tok) in tokenizers(&reference) {
        let vocab = &folder["vocabulary"];
        let size = vocab["size"].as_u64().unwrap_or(0) as usize;
        report.check(tok.vocab_size() == size, || {
            format!(
                "{}: vocab_size {} vs python {size}",
                name(folder),
                tok.vocab_size()
            )
        });
        for pair in vocab["tokens"].as_array().into_iter().flatten() {
            let id = pair[0].as_u64().unwrap_or(0) as u32;
            let want = pair[1].as_str();
            let got = tok.id_to_token(id);
            report.check(got.as_deref() == want, || {
                format!(
                    "{}: id_to_token({id}) is {got:?}, python {want:?}",
                    name(folder)
                )
            });
            if let Some(token) = want {
                let back = tok.token_to_id(token);
                report.check(back == Some(id), || {
                    format!(
                        "{}: token_to_id({token:?}) is {back:?}, want {id}",
                        name(folder)
                    )
                });
            }
        }
        let special = ids(&vocab["special_ids"]).unwrap_or_default();
        for &id in &special {
            report.check(tok.is_special(id), || {
                format!("{}: id {id} is special in python", name(folder))
            });
        }
    }
    report.finish("vocabulary entries");
}
