//! Prompt building: Hugging Face chat templates and tokenizers.
//!
//! A model folder carries a `tokenizer_config.json` (its chat template and
//! special tokens, or a `chat_template.jinja` beside it) and a
//! `tokenizer.json`. [`ChatTemplate`] renders a conversation into the prompt
//! text byte for byte as transformers' `apply_chat_template(...,
//! tokenize=False)` does: same jinja settings (`trim_blocks`,
//! `lstrip_blocks`, loop controls), same helpers (`raise_exception`,
//! `strftime_now`, a `tojson` that is Python's `json.dumps`), and Python's
//! printing and string methods. [`TextTokenizer`] turns that text into the
//! ids Python's `tokenizers` gives, and ids back into text, also
//! incrementally for streaming.
//!
//! Where MiniJinja and Python differ, the template source is adapted
//! (Python string escapes, line breaks, `{% generation %}` tags) and the
//! environment overrides what prints or tests differently: `None`/`True`,
//! `repr` of lists, dicts and tuples, floats, `str.strip`/`split` on Python
//! whitespace, `|join`, `|format`, `|indent`, `|round`, `|items`,
//! `|dictsort`, `is number`/`iterable`/`sequence`, and more. Known
//! differences that remain: the `~` operator prints booleans, None and
//! lists the Rust way (`true`, `none`); modulo (`%`) by a negative number
//! is never negative (Python's is); a `namespace()` counts as a mapping;
//! `\N{...}` escapes are kept as written; `strftime_now` reads the UTC
//! clock where transformers reads the local one.
//!
//! `tests/prompt_conformance.rs` checks all of this against references
//! written by `scripts/reference/prompts.py`.
//!
//! The files:
//! - `template.rs`: [`ChatTemplate`] and [`ChatMessage`], compiling and
//!   rendering;
//! - `tokenizer_config.rs`: a model folder's templates and special tokens;
//! - `environment.rs`, `filters.rs`: transformers' jinja environment, its
//!   globals, tests and filters;
//! - `source.rs`: the rewrites of a template's source for MiniJinja;
//! - `python/`: Python's printing, string methods, `json.dumps` and
//!   `strftime`;
//! - `tokenizer.rs`: [`TextTokenizer`] and [`IncrementalDecoder`];
//! - `error.rs`: [`PromptError`].

mod environment;
mod error;
mod filters;
pub mod python;
mod source;
mod template;
mod tokenizer;
mod tokenizer_config;

pub use error::PromptError;
pub use template::{ChatMessage, ChatTemplate};
pub use tokenizer::{IncrementalDecoder, TextTokenizer};

#[cfg(test)]
mod tests {
    #[test]
    fn prompt_types_can_be_shared_across_threads() {
        fn shared<T: Send + Sync + Clone>() {}
        shared::<super::ChatTemplate>();
        shared::<super::TextTokenizer>();
        shared::<super::IncrementalDecoder>();
    }
}
