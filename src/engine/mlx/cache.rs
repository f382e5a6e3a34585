//! Per-layer inference caches, and snapshots of them.
//!
//! MLX arrays are immutable values, so a snapshot of a cache after a prefix
//! is a clone of its handles: continuing from it appends new arrays and never
//! touches the kept ones. That is what lets the prefix cache keep a state and
//! hand it to any number of later questions.

use mlx_rs::{ops, Array};

use super::MlxResult;

/// Keys and values of one attention layer, `[batch, kv_heads, tokens, head_dim]`.
#[derive(Clone, Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
}

impl KvCache {
    /// Tokens held.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Appends `keys`/`values` for new positions and returns all of them.
    pub fn update_and_fetch(&mut self, keys: Array, values: Array) -> MlxResult<(Array, Array)> {
        let added = keys.shape()[2] as usize;
        let (k, v) = match (self.keys.take(), self.values.take()) {
            (Some(pk), Some(pv)) => (
                ops::concatenate(&[&pk, &keys], 2)?,
                ops::concatenate(&[&pv, &values], 2)?,
            ),
            _ => (keys, values),
        };
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        self.offset += added;
        Ok((k, v))
    }

    /// Arrays to evaluate so that the cache holds computed data.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys.iter().chain(self.values.iter())
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        self.arrays().map(Array::nbytes).sum()
    }
}

/// The state of one Gated DeltaNet layer: the last `kernel - 1` inputs of
/// its causal convolution `[batch, kernel - 1, conv_dim]` and the recurrent
/// state `[batch, value_heads, value_dim, key_dim]` (float32). Both are
/// replaced, not appended to, at each step, so their size does not grow
/// with the sequence.
#[derive(Clone, Default)]
pub struct DeltaCache {
    pub conv: Option<Array>,
    pub state: Option<Array>,
}

impl DeltaCache {
    /// Arrays to evaluate so that the cache holds computed data.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.conv.iter().chain(self.state.iter())
    }
}

/// One layer's cache. Each architecture holds the kinds its layers need;
/// all of them are immutable MLX arrays underneath, so cloning a cache is a
/// snapshot.
#[derive(Clone)]
pub enum LayerCache {
    /// Keys and values of every position (full attention).
    Kv(KvCache),
    /// Convolution inputs and recurrent state (Gated DeltaNet).
    Delta(DeltaCache),
}

impl LayerCache {
    /// The attention cache of a full-attention layer; an error (not a panic)
    /// when an architecture asks a layer for a kind it was not given.
    pub fn kv(&mut self) -> MlxResult<&mut KvCache> {
        match self {
            LayerCache::Kv(c) => Ok(c),
            _ => Err(super::MlxError::Config(
                "a full-attention layer was given a cache of another kind".into(),
            )),
        }
    }

    /// Arrays to evaluate so that the cache holds computed data.
    pub fn arrays(&self) -> Box<dyn Iterator<Item = &Array> + '_> {
        match self {
            LayerCache::Kv(c) => Box::new(c.arrays()),
            LayerCache::Delta(c) => Box::new(c.arrays()),
        }
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        self.arrays().map(Array::nbytes).sum()
    }
}

/// The caches of every layer of a model: the engine state after a prefix.
#[derive(Clone, Default)]
pub struct ModelCache {
    pub layers: Vec<LayerCache>,
    /// Tokens the model has read into these caches.
    offset: usize,
}

impl ModelCache {
    /// A cache of `layers` full-attention layers.
    pub fn new(layers: usize) -> Self {
        Self::with_layers(vec![LayerCache::Kv(KvCache::default()); layers])
    }

    /// A cache of the given per-layer kinds.
    pub fn with_layers(layers: Vec<LayerCache>) -> Self {
        ModelCache { layers, offset: 0 }
    }

    /// Tokens held: the position of the next token.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Records that `tokens` more positions were read (by the model, once
    /// every layer has taken them).
    pub fn advance(&mut self, tokens: usize) {
        self.offset += tokens;
    }

    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(LayerCache::nbytes).sum()
    }

    /// Evaluates every array so a snapshot holds data, not a pending graph.
    pub fn eval(&self) -> MlxResult<()> {
        let arrays: Vec<&Array> = self.layers.iter().flat_map(LayerCache::arrays).collect();
        mlx_rs::transforms::eval(arrays)?;
        Ok(())
    }
}
