//! The errors of prompt building: [`PromptError`].

use std::path::PathBuf;

/// Everything that can go wrong while loading or using a chat template or a
/// tokenizer. Each message says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("could not read {}: {source}; check that the model folder exists and is readable", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{} is not valid JSON ({source}); fetch or convert the model folder again", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    #[error("{}: {detail}", path.display())]
    BadConfig { path: PathBuf, detail: String },

    #[error(
        "{} has no chat template: it has no `chat_template` entry and no chat_template.jinja \
         next to it; add the model's template there",
        path.display()
    )]
    NoChatTemplate { path: PathBuf },

    #[error(
        "{} has several chat templates ({}) and none is named \"default\"; name the one to use \"default\"",
        path.display(),
        names.join(", ")
    )]
    NoDefaultTemplate { path: PathBuf, names: Vec<String> },

    #[error("the chat template does not compile: {detail}; fix the template or use the one the model was published with")]
    TemplateSyntax { detail: String },

    /// The template called `raise_exception(message)`: the conversation is
    /// not one this model accepts. `message` is the template's own text.
    #[error("the chat template rejected the conversation: {message}")]
    TemplateRaised { message: String },

    #[error("rendering the chat template failed: {detail}; check the messages (role, content) and the template arguments")]
    Render { detail: String },

    #[error("the conversation is empty; send at least one message")]
    EmptyConversation,

    #[error("message {index} is not a JSON object with a role and content ({detail})")]
    BadMessage { index: usize, detail: String },

    #[error("could not load the tokenizer {}: {detail}; fetch or convert the model folder again", path.display())]
    TokenizerLoad { path: PathBuf, detail: String },

    #[error("tokenization failed: {detail}")]
    Encode { detail: String },

    #[error(
        "detokenization failed: {detail}; the token ids may not belong to this model's vocabulary"
    )]
    Decode { detail: String },
}
