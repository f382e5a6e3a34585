//! The bases' tokenizer families, as far as registry packages ship them
//! (`scripts/fetch-assets.sh`): Qwen3 and Gemma 3 tokenizer files, and the
//! Qwen3.5/3.6 BPE ranks. Decision prompts are rendered with each, the
//! option letters must be single tokens, and the letter read at the answer
//! position must be the token a model would produce there.
//! `docs/design/tokenizers-of-bases.md` says what this does and does not
//! cover.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use common::asset;
use decisio::prompt::{ChatTemplate, TextTokenizer};
use decisio::text_route::decide::{render, Question, State, LETTERS, MAX_OPTIONS, PAD_TEXT};
use decisio::text_route::systemone::{label_forms, letter_codes, one_token_codes, PromptFormat};
use decisio::text_route::TextRoute;
use serde_json::Value;

/// MMLU rows used as decision questions, per tokenizer.
const MMLU_QUESTIONS: usize = 300;

struct Family {
    name: &'static str,
    tokenizer: TextTokenizer,
    template: ChatTemplate,
}

fn family(name: &'static str, folder: &str) -> Family {
    let dir = asset(folder);
    Family {
        name,
        tokenizer: TextTokenizer::from_file(dir.join("tokenizer.json")).unwrap(),
        template: ChatTemplate::from_tokenizer_config(dir.join("tokenizer_config.json")).unwrap(),
    }
}

fn reference_dir() -> PathBuf {
    std::env::var_os("DECISIO_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reference"))
}

/// The Qwen3.6 `tokenizer.json` built from the ranks by
/// `scripts/reference/qwen3_6_tokenizer.py` (`make reference`).
fn qwen3_6_tokenizer() -> TextTokenizer {
    let path = reference_dir().join("qwen3_6/tokenizer.json");
    assert!(
        path.exists(),
        "{} is missing; run `make reference` (scripts/reference/qwen3_6_tokenizer.py)",
        path.display()
    );
    TextTokenizer::from_file(path).unwrap()
}

fn mmlu_questions(n: usize) -> Vec<Question> {
    let text = std::fs::read_to_string(asset("mmlu.jsonl")).unwrap();
    let rows: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let step = rows.len() / n;
    (0..n)
        .map(|i| {
            let row = &rows[i * step];
            let s = |k: &str| row[k].as_str().unwrap().to_string();
            Question {
                id: None,
                text: s("question"),
                options: vec![s("answer_a"), s("answer_b"), s("answer_c"), s("answer_d")],
                abstain_below: None,
                temperature: None,
                head: None,
                wire: None,
                bias: None,
                listed: true,
            }
        })
        .collect()
}

/// The letters A to Z as the codes of a question's options.
fn letters26() -> Vec<String> {
    LETTERS.iter().map(|l| l.to_string()).collect()
}

/// Every letter is one token that decodes back to the letter, the letters
/// are distinct, and the padding filler is one token.
fn check_letters(name: &str, tok: &TextTokenizer) -> Vec<u32> {
    let ids = TextRoute::letter_ids(tok).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(ids.len(), 26);
    let mut seen = ids.clone();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 26, "{name}: letters share ids: {ids:?}");
    for (l, id) in LETTERS.iter().zip(&ids) {
        assert_eq!(tok.decode(&[*id], false).unwrap(), *l, "{name}");
        assert!(!tok.is_special(*id), "{name}: {l} is special");
    }
    assert_eq!(tok.encode(PAD_TEXT, false).unwrap().len(), 1, "{name}: pad");
    ids
}

/// Renders decisions on MMLU questions and checks that the letter a model
/// writes right after the prompt is the single token the route reads: the
/// prompt followed by the letter tokenizes as the prompt's tokens and the
/// letter's id. Returns how many prompts were checked.
fn check_answer_position(name: &str, tok: &TextTokenizer, template: &ChatTemplate) -> usize {
    let letters = check_letters(name, tok);
    let codes = one_token_codes(tok, "");
    assert_eq!(codes.len(), MAX_OPTIONS, "{name}: letter codes");
    let mut checked = 0;
    for (i, q) in mmlu_questions(MMLU_QUESTIONS).iter().enumerate() {
        let states = [
            State::Text(format!("Question {i} of a practice exam.")),
            State::Messages(vec![
                serde_json::json!({"role": "user", "content": "I have an exam question."}),
                serde_json::json!({"role": "assistant", "content": "Go ahead."}),
            ]),
        ];
        for state in &states {
            let r = render(template, state, q, &letters26())
                .unwrap_or_else(|e| panic!("{name}: {e:?}"));
            let full = format!("{}{}", r.prefix, r.suffix);
            if let State::Text(text) = state {
                assert!(
                    r.prefix.ends_with(text.trim_end()),
                    "{name}: {:?}",
                    r.prefix
                );
            }
            assert!(r.suffix.contains(q.text.trim()), "{name}");
            let base = tok.encode(&full, false).unwrap();
            // Letters A to D on every prompt; all 26 on the first, and
            // there also every further code of the route's (`AA`, `AB`, ...
            // up to 255 options).
            let mut letters: Vec<(String, u32)> = LETTERS
                .iter()
                .map(|l| l.to_string())
                .zip(letters.iter().copied())
                .collect();
            if checked == 0 {
                letters.extend(codes[26..].iter().cloned());
            } else {
                letters.truncate(4);
            }
            for (l, id) in &letters {
                let with = tok.encode(&format!("{full}{l}"), false).unwrap();
                assert_eq!(
                    with.len(),
                    base.len() + 1,
                    "{name}: `{l}` after the prompt is not one more token: {:?}",
                    &with[base.len().saturating_sub(2)..]
                );
                assert_eq!(&with[..base.len()], &base[..], "{name}: `{l}` merges back");
                assert_eq!(with[base.len()], *id, "{name}: `{l}` is another token");
            }
            checked += 1;
        }
    }
    checked
}

#[test]
fn qwen3_decision_prompts_read_single_letters() {
    let f = family("qwen3", "qwen3");
    assert!(f.template.supports_enable_thinking());
    let n = check_answer_position(f.name, &f.tokenizer, &f.template);
    assert_eq!(n, 2 * MMLU_QUESTIONS);
    // Thinking is switched off, so the answer follows an empty think block.
    let q = &mmlu_questions(1)[0];
    let r = render(
        &f.template,
        &State::Text("A state.".into()),
        q,
        &letters26(),
    )
    .unwrap();
    assert!(
        r.suffix
            .ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{:?}",
        r.suffix
    );
}

#[test]
fn gemma3_decision_prompts_read_single_letters() {
    let f = family("gemma3", "gemma3");
    let n = check_answer_position(f.name, &f.tokenizer, &f.template);
    assert_eq!(n, 2 * MMLU_QUESTIONS);
    let q = &mmlu_questions(1)[0];
    let r = render(
        &f.template,
        &State::Text("A state.".into()),
        q,
        &letters26(),
    )
    .unwrap();
    assert!(
        r.prefix.starts_with("<bos><start_of_turn>user\n"),
        "{:?}",
        r.prefix
    );
    assert!(
        r.suffix.ends_with("<end_of_turn>\n<start_of_turn>model\n"),
        "{:?}",
        r.suffix
    );
}

#[test]
fn gemma3_reads_every_form_of_a_label_and_no_two_labels_share_one() {
    // The Gemma bases' summed forms: ` A`, `A` and the byte-fallback token
    // `<0x41>` for a single letter, ` AB` and `AB` where each is one token;
    // ` yes`, `yes`, ` Yes`, `Yes`. No token is read for two labels.
    let f = family("gemma3", "gemma3");
    let format = PromptFormat::GEMMA;
    let codes = letter_codes(&f.tokenizer);
    assert_eq!(codes.len(), 255);
    let mut owner = HashMap::new();
    for (code, spaced) in &codes {
        let forms = label_forms(&f.tokenizer, code, &format).unwrap();
        assert_eq!(forms[0], *spaced, "{code}: the spaced form first");
        if code.len() == 1 {
            let byte = f
                .tokenizer
                .token_to_id(&format!("<0x{:02X}>", code.as_bytes()[0]));
            assert_eq!(forms.len(), 3, "{code}: {forms:?}");
            assert_eq!(forms.last().copied(), byte, "{code}");
        }
        for t in forms {
            if let Some(other) = owner.insert(t, code.clone()) {
                panic!("token {t} is read for {other} and {code}");
            }
        }
    }
    for word in ["yes", "no"] {
        let forms = label_forms(&f.tokenizer, word, &format).unwrap();
        assert_eq!(forms.len(), 4, "{word}: {forms:?}");
    }
}

/// Decodes standard base64 (the tiktoken file's token column).
fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {text}"),
    };
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|&c| c != b'=') {
        acc = (acc << 6) | value(c) as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// The Qwen3.5/3.6 ranks: token bytes to rank.
fn qwen3_6_ranks() -> HashMap<Vec<u8>, u32> {
    let text = std::fs::read_to_string(asset("qwen3_6/qwen3_6.tiktoken")).unwrap();
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (token, rank) = l.split_once(' ').unwrap();
            (base64(token), rank.parse().unwrap())
        })
        .collect()
}

#[test]
fn qwen3_6_ranks_hold_the_letters_at_qwen3s_ids() {
    let ranks = qwen3_6_ranks();
    assert_eq!(ranks.len(), 248_044);
    let qwen3 = family("qwen3", "qwen3").tokenizer;
    let qwen3_ids = check_letters("qwen3", &qwen3);
    for (l, id) in LETTERS.iter().zip(&qwen3_ids) {
        let rank = ranks.get(l.as_bytes()).copied();
        assert_eq!(
            rank,
            Some(*id),
            "`{l}`: Qwen3.6 rank {rank:?}, Qwen3 id {id}"
        );
    }
    let filler = qwen3.encode(PAD_TEXT, false).unwrap();
    assert_eq!(ranks.get(PAD_TEXT.as_bytes()).copied(), Some(filler[0]));
    // The reference decisio's filler token (`PAD_TOKEN` in its
    // `serve/vllm_engine.py`): 198, `\n` on Qwen's vocabulary.
    assert_eq!(filler, [198]);
    // The letters agree, but the vocabularies do not: Qwen3's tokenizer is
    // no stand-in for Qwen3.6's.
    let same = (0..qwen3.vocab_size() as u32)
        .filter(|&id| !qwen3.is_special(id))
        .filter(|&id| {
            qwen3
                .token_bytes(id)
                .is_some_and(|b| ranks.get(&b) == Some(&id))
        })
        .count();
    assert!(same < 1_000, "{same} Qwen3 ids equal Qwen3.6 ranks");
}

#[test]
fn qwen3_6_tokenizer_built_from_the_ranks_matches_the_package() {
    let tok = qwen3_6_tokenizer();
    let ranks = qwen3_6_ranks();
    // The vocabulary is the ranks, byte for byte, and the 33 special tokens
    // follow them.
    for (bytes, rank) in &ranks {
        assert_eq!(
            tok.token_bytes(*rank).as_deref(),
            Some(&bytes[..]),
            "rank {rank}"
        );
    }
    assert_eq!(tok.vocab_size(), 248_044 + 33);
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(248_044));
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(248_045));
    assert_eq!(tok.token_to_id("<think>"), Some(248_068));
    assert_eq!(tok.token_to_id("<|audio_pad|>"), Some(248_076));
    // Encodings equal the package's own tokenizer (tiktoken) on MMLU texts.
    let path = reference_dir().join("qwen3_6/qwen3_6-encodings.json");
    let reference: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let texts = reference["texts"].as_array().unwrap();
    assert!(texts.len() >= 2_000, "{}", texts.len());
    let mut tokens = 0;
    for entry in texts {
        let text = entry["text"].as_str().unwrap();
        let want: Vec<u32> = entry["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode(text, false).unwrap(), want, "{text:?}");
        tokens += want.len();
    }
    assert!(tokens > 200_000, "{tokens}");
    // Decision prompts, rendered with the Qwen3 template (no Qwen3.6
    // template ships in a registry package), read single letters.
    let qwen3 = family("qwen3", "qwen3");
    let n = check_answer_position("qwen3.6", &tok, &qwen3.template);
    assert_eq!(n, 2 * MMLU_QUESTIONS);
}
