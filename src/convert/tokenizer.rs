//! `tokenizer.json` and `tokenizer_config.json` rebuilt from the GGUF
//! vocabulary, merges and token types.
//!
//! Only byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`) are
//! handled. The pre-tokenizer follows `tokenizer.ggml.pre`, llama.cpp's name
//! for the splitting rules of the original tokenizer; a name without known
//! rules is refused rather than guessed, because a wrong split silently
//! changes token ids.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::processors::sequence::Sequence as ProcessorSequence;
use tokenizers::processors::template::{SpecialToken, Template, TemplateProcessing};
use tokenizers::{AddedToken, PostProcessorWrapper, PreTokenizerWrapper, Tokenizer};

use super::meta::{bad, missing, Meta};
use super::ConvertError;

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Pre-tokenizer names (`tokenizer.ggml.pre`) the converter knows.
pub const KNOWN_PRE_TOKENIZERS: &[&str] = &["smollm", "gpt2", "default"];

/// The rebuilt tokenizer and what the other files need from it.
pub(crate) struct BuiltTokenizer {
    pub tokenizer: Tokenizer,
    pub tokenizer_config: Value,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
}

/// The pre-tokenizer llama.cpp's `pre` name stands for.
pub(crate) fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper, ConvertError> {
    let byte_level = ByteLevel::new(false, true, true);
    match pre {
        "smollm" => Ok(Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()),
        "gpt2" | "default" => Ok(byte_level.into()),
        other => Err(ConvertError::UnsupportedPreTokenizer {
            pre: other.to_owned(),
        }),
    }
}

/// A token's name in a template, as the template syntax allows it.
fn template_id(content: &str, fallback: &str) -> String {
    if content.is_empty() || content.contains([' ', ':']) || content.starts_with('$') {
        fallback.to_owned()
    } else {
        content.to_owned()
    }
}

/// ByteLevel post-processing, plus BOS/EOS when the GGUF asks for them.
fn post_processor(
    bos: Option<(&str, u32)>,
    eos: Option<(&str, u32)>,
) -> Result<PostProcessorWrapper, ConvertError> {
    let byte_level = ByteLevel::default().trim_offsets(false);
    if bos.is_none() && eos.is_none() {
        return Ok(byte_level.into());
    }
    let mut special_tokens = Vec::new();
    let mut name_of = |token: Option<(&str, u32)>, fallback: &str| {
        token.map(|(content, id)| {
            let name = template_id(content, fallback);
            special_tokens.push(SpecialToken::new(
                name.clone(),
                vec![id],
                vec![content.to_owned()],
            ));
            name
        })
    };
    let bos = name_of(bos, "<bos>");
    let eos = name_of(eos, "<eos>");
    let piece =
        |name: &Option<String>, type_id: u32| name.as_ref().map(|name| format!("{name}:{type_id}"));
    let single: Vec<String> = [piece(&bos, 0), Some("$A:0".into()), piece(&eos, 0)]
        .into_iter()
        .flatten()
        .collect();
    let pair: Vec<String> = [
        piece(&bos, 0),
        Some("$A:0".into()),
        piece(&eos, 0),
        piece(&bos, 1),
        Some("$B:1".into()),
        piece(&eos, 1),
    ]
    .into_iter()
    .flatten()
    .collect();
    let special_tokens = special_tokens
        .into_iter()
        .collect::<tokenizers::Result<Vec<_>>>()
        .map_err(|e| ConvertError::Tokenizer(e.to_string()))?;
    let template = TemplateProcessing::builder()
        .single(Template::try_from(single).map_err(ConvertError::Tokenizer)?)
        .pair(Template::try_from(pair).map_err(ConvertError::Tokenizer)?)
        .special_tokens(special_tokens)
        .build()
        .map_err(|e| ConvertError::Tokenizer(e.to_string()))?;
    Ok(ProcessorSequence::new(vec![byte_level.into(), template.into()]).into())
}

fn token_for(
    tokens: &[String],
    key: &str,
    id: Option<u32>,
) -> Result<Option<String>, ConvertError> {
    id.map(|id| {
        tokens
            .get(id as usize)
            .cloned()
            .ok_or_else(|| bad(key, format!("token id {id} is outside the vocabulary")))
    })
    .transpose()
}

/// The BPE merges, each two tokens separated by one space.
fn merges(meta: &Meta) -> Result<Vec<(String, String)>, ConvertError> {
    meta.strings("tokenizer.ggml.merges")?
        .ok_or_else(|| missing("tokenizer.ggml.merges"))?
        .into_iter()
        .map(|merge| match merge.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                Ok((a.to_owned(), b.to_owned()))
            }
            _ => Err(bad(
                "tokenizer.ggml.merges",
                format!("{merge:?} is not two tokens separated by one space"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()
}

/// `added_tokens_decoder` of `tokenizer_config.json`: each added token by
/// its id, as the Hugging Face tokenizers write it.
fn added_tokens_decoder(added: &BTreeMap<u32, AddedToken>) -> Map<String, Value> {
    let mut decoder = Map::new();
    for (id, token) in added {
        decoder.insert(
            id.to_string(),
            json!({
                "content": token.content,
                "lstrip": token.lstrip,
                "normalized": token.normalized,
                "rstrip": token.rstrip,
                "single_word": token.single_word,
                "special": token.special,
            }),
        );
    }
    decoder
}

/// The tokens GGUF marks as control (special) or user-defined (plain),
/// by id: what the tokenizer adds to its vocabulary.
fn added_tokens(tokens: &[String], token_types: &[i32]) -> BTreeMap<u32, AddedToken> {
    let mut added: BTreeMap<u32, AddedToken> = BTreeMap::new();
    for (id, (token, kind)) in tokens.iter().zip(token_types).enumerate() {
        let special = match *kind {
            TOKEN_TYPE_CONTROL => true,
            TOKEN_TYPE_USER_DEFINED => false,
            _ => continue,
        };
        added.insert(id as u32, AddedToken::from(token.clone(), special));
    }
    added
}

/// Rebuilds the tokenizer. `model_max_length` is the context length and
/// `vocab_size` the number of embedding rows (which may exceed the number of
/// tokens, never fall short of it).
pub(crate) fn build(
    meta: &Meta,
    model_max_length: u32,
    vocab_size: u32,
) -> Result<BuiltTokenizer, ConvertError> {
    let model = meta
        .string("tokenizer.ggml.model")?
        .ok_or_else(|| missing("tokenizer.ggml.model"))?;
    if model != "gpt2" {
        return Err(ConvertError::UnsupportedTokenizer { model });
    }
    let pre = meta
        .string("tokenizer.ggml.pre")?
        .unwrap_or_else(|| "default".to_owned());
    let pre_tokenizer = pre_tokenizer(&pre)?;

    let tokens = meta
        .strings("tokenizer.ggml.tokens")?
        .ok_or_else(|| missing("tokenizer.ggml.tokens"))?;
    if tokens.len() > vocab_size as usize {
        return Err(bad(
            "tokenizer.ggml.tokens",
            format!(
                "{} tokens, but the embedding has only {vocab_size} rows",
                tokens.len()
            ),
        ));
    }
    let token_types = meta
        .i32s("tokenizer.ggml.token_type")?
        .unwrap_or_else(|| vec![1; tokens.len()]);
    if token_types.len() != tokens.len() {
        return Err(bad(
            "tokenizer.ggml.token_type",
            format!("{} types for {} tokens", token_types.len(), tokens.len()),
        ));
    }
    let merges = merges(meta)?;

    let id_of = |key: &str| meta.u32(key);
    let bos_token_id = id_of("tokenizer.ggml.bos_token_id")?;
    let eos_token_id = id_of("tokenizer.ggml.eos_token_id")?;
    let unk_token_id = id_of("tokenizer.ggml.unknown_token_id")?;
    let pad_token_id = id_of("tokenizer.ggml.padding_token_id")?;
    let bos_token = token_for(&tokens, "tokenizer.ggml.bos_token_id", bos_token_id)?;
    let eos_token = token_for(&tokens, "tokenizer.ggml.eos_token_id", eos_token_id)?;
    let unk_token = token_for(&tokens, "tokenizer.ggml.unknown_token_id", unk_token_id)?;
    let pad_token = token_for(&tokens, "tokenizer.ggml.padding_token_id", pad_token_id)?;
    let add_bos_token = meta
        .boolean("tokenizer.ggml.add_bos_token")?
        .unwrap_or(false);
    let add_eos_token = meta
        .boolean("tokenizer.ggml.add_eos_token")?
        .unwrap_or(false);

    // A repeated token keeps its first id, as the vocabulary maps text to one id.
    let mut vocab = Vocab::default();
    for (id, token) in tokens.iter().enumerate() {
        vocab.entry(token.clone()).or_insert(id as u32);
    }
    let mut bpe = BPE::builder().vocab_and_merges(vocab, merges);
    if let Some(unk) = &unk_token {
        bpe = bpe.unk_token(unk.clone());
    }
    let bpe = bpe
        .build()
        .map_err(|e| ConvertError::Tokenizer(e.to_string()))?;

    let post = post_processor(
        bos_token
            .as_deref()
            .zip(bos_token_id)
            .filter(|_| add_bos_token),
        eos_token
            .as_deref()
            .zip(eos_token_id)
            .filter(|_| add_eos_token),
    )?;

    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer
        .with_pre_tokenizer(Some(pre_tokenizer))
        .with_decoder(Some(ByteLevelDecoder::default()))
        .with_post_processor(Some(post));

    let added = added_tokens(&tokens, &token_types);
    let (specials, plain): (Vec<AddedToken>, Vec<AddedToken>) =
        added.values().cloned().partition(|t| t.special);
    tokenizer.add_special_tokens(&specials);
    tokenizer.add_tokens(&plain);

    let decoder = added_tokens_decoder(&added);
    let mut config = json!({
        "add_bos_token": add_bos_token,
        "add_eos_token": add_eos_token,
        "added_tokens_decoder": decoder,
        "bos_token": bos_token,
        "clean_up_tokenization_spaces": false,
        "eos_token": eos_token,
        "model_max_length": model_max_length,
        "pad_token": pad_token,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": unk_token,
    });
    if let Some(template) = meta.string("tokenizer.chat_template")? {
        config["chat_template"] = template.into();
    }

    Ok(BuiltTokenizer {
        tokenizer,
        tokenizer_config: config,
        bos_token_id,
        eos_token_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_pre_tokenizers_build_and_others_are_refused() {
        for pre in KNOWN_PRE_TOKENIZERS {
            pre_tokenizer(pre).unwrap();
        }
        let err = pre_tokenizer("llama-bpe").err().unwrap();
        assert!(err.to_string().contains("llama-bpe"), "{err}");
    }

    fn tiny(post: PostProcessorWrapper) -> Tokenizer {
        let mut vocab = Vocab::default();
        for (id, token) in ["<s>", "</s>", "a", "b"].into_iter().enumerate() {
            vocab.insert(token.to_owned(), id as u32);
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, vec![])
            .build()
            .unwrap();
        let mut tokenizer = Tokenizer::new(bpe);
        tokenizer
            .with_pre_tokenizer(Some(pre_tokenizer("gpt2").unwrap()))
            .with_post_processor(Some(post));
        tokenizer.add_special_tokens(&[
            AddedToken::from("<s>", true),
            AddedToken::from("</s>", true),
        ]);
        tokenizer
    }

    fn ids(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
        tokenizer.encode(text, true).unwrap().get_ids().to_vec()
    }

    #[test]
    fn post_processor_adds_bos_and_eos_only_when_asked() {
        let plain = post_processor(None, None).unwrap();
        assert!(matches!(plain, PostProcessorWrapper::ByteLevel(_)));
        assert_eq!(ids(&tiny(plain), "ab"), [2, 3]);

        let bos = post_processor(Some(("<s>", 0)), None).unwrap();
        assert_eq!(ids(&tiny(bos), "ab"), [0, 2, 3]);
        let both = post_processor(Some(("<s>", 0)), Some(("</s>", 1))).unwrap();
        let both = tiny(both);
        assert_eq!(ids(&both, "ab"), [0, 2, 3, 1]);
        let pair = both.encode(("a", "b"), true).unwrap();
        assert_eq!(pair.get_ids(), [0, 2, 1, 0, 3, 1]);
        assert_eq!(pair.get_type_ids(), [0, 0, 0, 1, 1, 1]);

        assert_eq!(template_id("a b", "<bos>"), "<bos>");
        assert_eq!(template_id("<|begin|>", "<bos>"), "<|begin|>");
    }
}
