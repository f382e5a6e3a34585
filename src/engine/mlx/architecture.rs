//! The seam between the engine and a model's architecture: what every
//! architecture file (`llama`, `qwen3_5`, `gemma4`) implements, directly
//! ([`Architecture`]) or by naming its decoder stack ([`Stacked`]).

use mlx_rs::Array;

use super::cache::ModelCache;
use super::error::MlxResult;
use super::layers::{Block, DecoderStack, LastHidden};

/// What the engine asks of an architecture. Each architecture is one file
/// of this module; the engine, the prefix cache and the routes above it see
/// only this.
pub trait Architecture {
    /// Empty caches, one per layer, of the kinds the layers need.
    fn new_cache(&self) -> ModelCache;
    /// Width of the hidden states.
    fn hidden_size(&self) -> usize;
    /// Decoder blocks.
    fn num_layers(&self) -> usize;
    /// Runs `tokens` (`[B, L]`: one row, or the rows of a question pass on
    /// a question cache) from position `cache.offset()`, extending every
    /// layer's cache, and returns the final hidden states (after the last
    /// norm) of every position, `[B, L, D]`, and block `tap`'s output at
    /// every position when it names one.
    fn hidden(
        &self,
        tokens: &Array,
        cache: &mut ModelCache,
        tap: Option<usize>,
    ) -> MlxResult<(Array, Option<Array>)>;
    /// Like [`Architecture::hidden`] for the last position only (`[1, 1, D]`;
    /// an architecture may skip work no other position needs), and, when
    /// `tap` names a block, that block's output at the last position.
    fn last_hidden(
        &self,
        tokens: &Array,
        cache: &mut ModelCache,
        tap: Option<usize>,
    ) -> MlxResult<LastHidden>;
    /// Logits over the vocabulary for final hidden states.
    fn logits(&self, hidden: &Array) -> MlxResult<Array>;
}

/// An architecture whose forward pass is its [`DecoderStack`]'s (llama,
/// Qwen3.5): it names its stack, its caches and its width, and is an
/// [`Architecture`] by them. One whose pass is its own (Gemma 4's shared
/// caches and soft-capped logits) implements [`Architecture`] itself.
pub trait Stacked {
    type Block: Block;
    /// The stack the forward pass runs.
    fn stack(&self) -> &DecoderStack<Self::Block>;
    /// Empty caches, one per layer, of the kinds the layers need.
    fn new_cache(&self) -> ModelCache;
    /// Width of the hidden states.
    fn hidden_size(&self) -> usize;
}

impl<T: Stacked> Architecture for T {
    fn new_cache(&self) -> ModelCache {
        Stacked::new_cache(self)
    }

    fn hidden_size(&self) -> usize {
        Stacked::hidden_size(self)
    }

    fn num_layers(&self) -> usize {
        self.stack().layers.len()
    }

    fn hidden(
        &self,
        tokens: &Array,
        cache: &mut ModelCache,
        tap: Option<usize>,
    ) -> MlxResult<(Array, Option<Array>)> {
        self.stack().hidden(tokens, cache, tap)
    }

    fn last_hidden(
        &self,
        tokens: &Array,
        cache: &mut ModelCache,
        tap: Option<usize>,
    ) -> MlxResult<LastHidden> {
        self.stack().last_hidden(tokens, cache, tap)
    }

    fn logits(&self, hidden: &Array) -> MlxResult<Array> {
        self.stack().logits(hidden)
    }
}
