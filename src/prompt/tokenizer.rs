//! Tokenization with the `tokenizers` crate, which gives the same ids as
//! Python's `tokenizers` for the same `tokenizer.json`.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value as Json;
use tokenizers::Tokenizer;

use super::PromptError;

/// A `tokenizer.json` tokenizer. Cheap to clone (the vocabulary is shared).
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    tokenizer: Tokenizer,
    /// How a single token turns into bytes, read from the decoder.
    byte_steps: Vec<ByteStep>,
    /// [`TextTokenizer::longest_token_bytes`], computed on first use.
    longest: std::sync::OnceLock<usize>,
    /// [`TextTokenizer::shrink_bound`], read from the normalizer once.
    shrink: Option<usize>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl TextTokenizer {
    /// Loads a `tokenizer.json` (`path` may be the file or its folder).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, PromptError> {
        let mut path = path.as_ref().to_path_buf();
        if path.is_dir() {
            path.push("tokenizer.json");
        }
        let bytes = std::fs::read(&path).map_err(|source| PromptError::Io {
            path: path.clone(),
            source,
        })?;
        Self::from_bytes(&bytes).map_err(|e| match e {
            PromptError::TokenizerLoad { detail, .. } => {
                PromptError::TokenizerLoad { path, detail }
            }
            other => other,
        })
    }

    /// A tokenizer from the text of a `tokenizer.json`.
    pub fn from_bytes(json: &[u8]) -> Result<Self, PromptError> {
        let tokenizer = Tokenizer::from_bytes(json).map_err(|e| PromptError::TokenizerLoad {
            path: "tokenizer.json".into(),
            detail: e.to_string(),
        })?;
        Ok(Self::from_tokenizer(tokenizer))
    }

    /// Wraps an already built tokenizer.
    pub fn from_tokenizer(tokenizer: Tokenizer) -> Self {
        let byte_steps = tokenizer
            .get_decoder()
            .and_then(|d| serde_json::to_value(d).ok())
            .map(|d| byte_steps(&d))
            .unwrap_or_default();
        let normalizer = tokenizer.get_normalizer();
        let shrink = match normalizer.and_then(|n| serde_json::to_value(n).ok()) {
            None if normalizer.is_none() => Some(1),
            None => None,
            Some(n) => shrink_of(&n),
        };
        TextTokenizer {
            inner: Arc::new(Inner {
                tokenizer,
                byte_steps,
                longest: Default::default(),
                shrink,
            }),
        }
    }

    /// The wrapped tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// Token ids of `text`, as Python's `Tokenizer.encode(text,
    /// add_special_tokens=...).ids`. Special tokens written in `text` are
    /// recognized as such; `add_special_tokens` adds the post-processor's
    /// (e.g. a leading `<bos>`), which chat prompts already hold.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, PromptError> {
        self.inner
            .tokenizer
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| PromptError::Encode {
                detail: e.to_string(),
            })
    }

    /// Text of `ids`, as Python's `Tokenizer.decode`. Ids outside the
    /// vocabulary are skipped, as the library does.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, PromptError> {
        self.inner
            .tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| PromptError::Decode {
                detail: e.to_string(),
            })
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.tokenizer.token_to_id(token)
    }

    /// The token's vocabulary string (byte-level tokens in their mapped
    /// form, e.g. `Ġthe`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.tokenizer.id_to_token(id)
    }

    /// The most bytes of text one token stands for: the longest
    /// [`Self::token_bytes`] of the vocabulary, added tokens included
    /// (computed once, on first use). A text of `n` bytes is at least
    /// `n / (this × shrink)` tokens, `shrink` from [`Self::shrink_bound`].
    pub fn longest_token_bytes(&self) -> usize {
        *self.inner.longest.get_or_init(|| {
            self.inner
                .tokenizer
                .get_vocab(true)
                .into_values()
                .filter_map(|id| self.token_bytes(id))
                .map(|b| b.len())
                .max()
                .unwrap_or(1)
                .max(1)
        })
    }

    /// How many times the tokenizer's normalizer may shorten a text's
    /// bytes at most: 1 without one, 4 for Unicode normalization (NFKC
    /// maps a 4-byte character to a 1-byte one at most; composition turns
    /// at most three 3-byte characters into one), a `Replace` of a string
    /// by the ratio of their lengths. `None` where no bound is known (a
    /// normalizer that may delete text, or a pattern).
    pub fn shrink_bound(&self) -> Option<usize> {
        self.inner.shrink
    }

    /// Vocabulary size including added tokens (Python's `get_vocab_size()`).
    /// The model's embedding table may be larger.
    pub fn vocab_size(&self) -> usize {
        self.inner.tokenizer.get_vocab_size(true)
    }

    /// Whether `id` is a special added token (skipped by
    /// `decode(.., skip_special_tokens = true)`).
    pub fn is_special(&self, id: u32) -> bool {
        self.inner
            .tokenizer
            .get_added_tokens_decoder()
            .get(&id)
            .is_some_and(|t| t.special)
    }

    /// The bytes a token stands for, as OpenAI's logprobs `bytes` field wants
    /// them: byte-level BPE symbols mapped back (`Ġ` is 0x20), byte-fallback
    /// tokens (`<0x0A>`) as their byte, SentencePiece's `▁` as a space. A
    /// token may hold part of a UTF-8 character. `None` for an unknown id.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let token = self.id_to_token(id)?;
        Some(apply_byte_steps(&self.inner.byte_steps, token))
    }

    /// A streaming detokenizer for one generation.
    pub fn incremental(&self, skip_special_tokens: bool) -> IncrementalDecoder {
        IncrementalDecoder {
            tokenizer: self.clone(),
            skip_special_tokens,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        }
    }
}

/// Turns a stream of token ids into text pieces, each emitted once it is
/// whole: a character whose bytes span several tokens comes out with the
/// last of them, never as a replacement character. The concatenated pieces
/// (with [`IncrementalDecoder::finish`]) equal `decode` of all ids.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    tokenizer: TextTokenizer,
    skip_special_tokens: bool,
    /// The ids from the start of the text already emitted as `prefix`.
    ids: Vec<u32>,
    prefix: String,
    /// How many of `ids` make up `prefix`.
    prefix_index: usize,
}

impl IncrementalDecoder {
    /// Adds one token; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, PromptError> {
        if self.prefix.is_empty() && !self.ids.is_empty() {
            let prefix = self.decode(&self.ids)?;
            if !prefix.ends_with('\u{FFFD}') {
                self.prefix = prefix;
                self.prefix_index = self.ids.len();
            }
        }
        self.ids.push(id);
        let text = self.decode(&self.ids)?;
        if text.len() <= self.prefix.len() || text.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        let Some(new) = text.strip_prefix(self.prefix.as_str()) else {
            return Err(PromptError::Decode {
                detail: format!(
                    "token {id} changed text already streamed ({:?} became {:?})",
                    self.prefix, text
                ),
            });
        };
        let new = new.to_owned();
        // Keep only the tokens after the emitted prefix as the new context.
        let kept = self.ids.len() - self.prefix_index;
        self.ids.drain(..self.prefix_index);
        self.prefix = self.decode(&self.ids)?;
        self.prefix_index = kept;
        Ok(Some(new))
    }

    /// The text still held back at the end of the stream (an incomplete
    /// character comes out as U+FFFD, as `decode` writes it).
    pub fn finish(&mut self) -> Result<Option<String>, PromptError> {
        let text = self.decode(&self.ids)?;
        let rest = text
            .strip_prefix(self.prefix.as_str())
            .unwrap_or_default()
            .to_owned();
        self.ids.clear();
        self.prefix.clear();
        self.prefix_index = 0;
        Ok((!rest.is_empty()).then_some(rest))
    }

    fn decode(&self, ids: &[u32]) -> Result<String, PromptError> {
        self.tokenizer.decode(ids, self.skip_special_tokens)
    }
}

/// One step of turning a token string into bytes, mirroring the decoder.
#[derive(Debug, Clone)]
enum ByteStep {
    /// Byte-level BPE: every char is one byte (GPT-2's byte-to-unicode map).
    ByteLevel,
    /// `<0xNN>` tokens are the byte NN.
    ByteFallback,
    /// A literal replacement (`▁` to space).
    Replace(String, String),
    /// A `##` continuation prefix is removed.
    StripPrefix(String),
}

/// Reads the decoder's configuration (as serialized by the library).
fn byte_steps(decoder: &Json) -> Vec<ByteStep> {
    let mut steps = Vec::new();
    collect_steps(decoder, &mut steps);
    steps
}

fn collect_steps(decoder: &Json, steps: &mut Vec<ByteStep>) {
    match decoder.get("type").and_then(Json::as_str) {
        Some("Sequence") => {
            for d in decoder
                .get("decoders")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
            {
                collect_steps(d, steps);
            }
        }
        Some("ByteLevel") => steps.push(ByteStep::ByteLevel),
        Some("ByteFallback") => steps.push(ByteStep::ByteFallback),
        Some("Replace") => {
            let from = decoder.pointer("/pattern/String").and_then(Json::as_str);
            let to = decoder.get("content").and_then(Json::as_str);
            if let (Some(from), Some(to)) = (from, to) {
                steps.push(ByteStep::Replace(from.into(), to.into()));
            }
        }
        Some("Metaspace") => {
            let replacement = decoder
                .get("replacement")
                .and_then(Json::as_str)
                .unwrap_or("\u{2581}");
            steps.push(ByteStep::Replace(replacement.into(), " ".into()));
        }
        Some("WordPiece") => {
            let prefix = decoder.get("prefix").and_then(Json::as_str).unwrap_or("##");
            steps.push(ByteStep::StripPrefix(prefix.into()));
        }
        _ => {}
    }
}

fn apply_byte_steps(steps: &[ByteStep], token: String) -> Vec<u8> {
    let mut text = token;
    for step in steps {
        match step {
            ByteStep::ByteLevel => {
                // As the ByteLevel decoder: map every char, or keep the
                // token's own bytes when one is outside the map.
                let mapped: Option<Vec<u8>> = text.chars().map(char_to_byte).collect();
                return mapped.unwrap_or_else(|| text.into_bytes());
            }
            ByteStep::ByteFallback => {
                if let Some(b) = fallback_byte(&text) {
                    return vec![b];
                }
            }
            ByteStep::Replace(from, to) => text = text.replace(from.as_str(), to),
            ByteStep::StripPrefix(prefix) => {
                if let Some(rest) = text.strip_prefix(prefix.as_str()) {
                    text = rest.to_owned();
                }
            }
        }
    }
    text.into_bytes()
}

/// `<0xNN>` to the byte NN.
fn fallback_byte(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The inverse of GPT-2's `bytes_to_unicode`: printable Latin-1 bytes stand
/// for themselves, the other 68 bytes are U+0100.. in byte order.
fn char_to_byte(c: char) -> Option<u8> {
    let u = c as u32;
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    if u < 0x100 {
        return if printable(u) { Some(u as u8) } else { None };
    }
    let n = u - 0x100;
    (0u32..=0xff)
        .filter(|b| !printable(*b))
        .nth(n as usize)
        .map(|b| b as u8)
}

/// [`TextTokenizer::shrink_bound`] of a normalizer, from its JSON form.
fn shrink_of(n: &Json) -> Option<usize> {
    match n["type"].as_str()? {
        "NFC" | "NFD" | "NFKC" | "NFKD" => Some(4),
        "Prepend" => Some(1),
        // The Kelvin sign (3 bytes) lowercases to `k`.
        "Lowercase" => Some(3),
        "Replace" => {
            let from = n["pattern"]["String"].as_str()?.len();
            let to = n["content"].as_str()?.len();
            (to > 0).then(|| from.div_ceil(to).max(1))
        }
        "Sequence" => n["normalizers"]
            .as_array()?
            .iter()
            .try_fold(1usize, |bound, step| Some(bound * shrink_of(step)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_normalizer_shortens_text_by_a_known_bound_or_none() {
        let bound = |n: Json| shrink_of(&n);
        assert_eq!(bound(serde_json::json!({"type": "NFC"})), Some(4));
        let replace = |from: &str, to: &str| serde_json::json!({"type": "Replace", "pattern": {"String": from}, "content": to});
        // Gemma's: a space becomes `▁`, longer.
        assert_eq!(bound(replace(" ", "\u{2581}")), Some(1));
        assert_eq!(bound(replace("abcd", "x")), Some(4));
        assert_eq!(bound(replace("abcd", "")), None);
        let sequence = serde_json::json!({"type": "Sequence", "normalizers": [
            {"type": "NFKC"}, {"type": "Lowercase"}]});
        assert_eq!(bound(sequence), Some(12));
        assert_eq!(bound(serde_json::json!({"type": "BertNormalizer"})), None);
        let regex =
            serde_json::json!({"type": "Replace", "pattern": {"Regex": " +"}, "content": " "});
        assert_eq!(bound(regex), None);
    }

    #[test]
    fn byte_level_chars_map_back_to_bytes() {
        assert_eq!(char_to_byte('Ġ'), Some(0x20));
        assert_eq!(char_to_byte('Ċ'), Some(0x0a));
        assert_eq!(char_to_byte('Ā'), Some(0x00));
        assert_eq!(char_to_byte('a'), Some(b'a'));
        assert_eq!(char_to_byte('ÿ'), Some(0xff));
        assert_eq!(char_to_byte('ł'), Some(0xa0));
        assert_eq!(char_to_byte('Ń'), Some(0xad));
        assert_eq!(char_to_byte(' '), None);
        assert_eq!(char_to_byte('日'), None);
        let steps = [ByteStep::ByteLevel];
        assert_eq!(apply_byte_steps(&steps, "Ġthe".into()), b" the");
        assert_eq!(
            apply_byte_steps(&steps, "<|im_start|>".into()),
            b"<|im_start|>"
        );
    }

    #[test]
    fn sentencepiece_tokens_map_to_bytes() {
        let steps = [
            ByteStep::Replace("\u{2581}".into(), " ".into()),
            ByteStep::ByteFallback,
        ];
        assert_eq!(apply_byte_steps(&steps, "▁Hello".into()), b" Hello");
        assert_eq!(apply_byte_steps(&steps, "<0x0A>".into()), b"\n");
        assert_eq!(apply_byte_steps(&steps, "<0xF0>".into()), [0xf0]);
        assert_eq!(apply_byte_steps(&steps, "<0xZZ>".into()), b"<0xZZ>");
    }

    /// A byte-level tokenizer whose tokens are single bytes, so that
    /// multi-byte characters span several tokens.
    fn byte_tokenizer() -> TextTokenizer {
        let json = r#"{"version":"1.0","truncation":null,"padding":null,
            "added_tokens":[{"id":8,"content":"<|end|>","single_word":false,"lstrip":false,
                "rstrip":false,"normalized":false,"special":true}],
            "normalizer":null,
            "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},
            "post_processor":null,
            "decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},
            "model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,
                "end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,
                "vocab":{"a":0,"Ã":1,"©":2,"ð":3,"Ł":4,"ĺ":5,"Ģ":6,"Ġ":7},"merges":[]}}"#;
        TextTokenizer::from_bytes(json.as_bytes()).unwrap()
    }

    #[test]
    fn streaming_never_emits_half_a_character() {
        let tok = byte_tokenizer();
        let ids = tok.encode("aé😀 a<|end|>", false).unwrap();
        assert_eq!(ids, [0, 1, 2, 3, 4, 5, 6, 7, 0, 8]);
        let mut stream = tok.incremental(false);
        let pieces: Vec<Option<String>> = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
        let want: [Option<&str>; 10] = [
            Some("a"),
            None,
            Some("é"),
            None,
            None,
            None,
            Some("😀"),
            Some(" "),
            Some("a"),
            Some("<|end|>"),
        ];
        assert_eq!(pieces, want.map(|p| p.map(str::to_owned)));
        assert_eq!(stream.finish().unwrap(), None);

        // An unfinished character comes out at the end, as decode writes it.
        let mut stream = tok.incremental(true);
        assert_eq!(stream.push(0).unwrap().as_deref(), Some("a"));
        assert_eq!(stream.push(3).unwrap(), None);
        assert_eq!(stream.push(8).unwrap(), None);
        assert_eq!(stream.finish().unwrap().as_deref(), Some("\u{FFFD}"));
    }

    #[test]
    fn token_bytes_and_vocabulary() {
        let tok = byte_tokenizer();
        assert_eq!(tok.token_bytes(3), Some(vec![0xf0]));
        assert_eq!(tok.token_bytes(7), Some(b" ".to_vec()));
        assert_eq!(tok.token_bytes(8), Some(b"<|end|>".to_vec()));
        assert_eq!(tok.token_bytes(99), None);
        assert_eq!(tok.vocab_size(), 9);
        assert_eq!(tok.token_to_id("<|end|>"), Some(8));
        assert_eq!(tok.id_to_token(7).as_deref(), Some("Ġ"));
        assert!(tok.is_special(8));
        assert!(!tok.is_special(0));
        assert_eq!(tok.decode(&[0, 8], true).unwrap(), "a");
    }

    #[test]
    fn missing_tokenizer_file_is_an_io_error() {
        let err = TextTokenizer::from_file("/nonexistent/decisio/tokenizer.json").unwrap_err();
        assert!(matches!(err, PromptError::Io { .. }), "{err:?}");
    }

    #[test]
    fn bad_tokenizer_json_is_a_load_error() {
        let err = TextTokenizer::from_bytes(b"{\"model\": 3}").unwrap_err();
        assert!(matches!(err, PromptError::TokenizerLoad { .. }), "{err:?}");
        assert!(err.to_string().contains("fetch or convert"));
    }
}
