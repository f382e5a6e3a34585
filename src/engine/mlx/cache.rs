//! Per-layer inference caches, and snapshots of them.
//!
//! MLX arrays are immutable values, so a snapshot of a cache after a prefix
//! is a clone of its handles: continuing from it appends new arrays and never
//! touches the kept ones. That is what lets the prefix cache keep a state and
//! hand it to any number of later questions.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};

use super::{MlxError, MlxResult};

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

/// Keys and values of one sliding-window attention layer: the last
/// `window - 1` positions, in order, `[batch, kv_heads, tokens, head_dim]`.
///
/// A query attends to itself and the `window - 1` positions before it, so
/// that is all a layer ever needs from earlier calls. An update of `L`
/// positions returns the kept positions followed by the new ones (at most
/// `window - 1 + L`), and the caller masks each query to its own window.
/// This gives every query the same keys and the same mask as mlx-lm's
/// `RotatingKVCache` gives it for a multi-token update (which also keeps
/// `max_size - 1` positions before appending); for a single token both give
/// the last `window` positions, here in temporal order, there in the rotated
/// buffer's order (the same attention up to the order of a sum). Arrays are
/// never written in place, so a clone is a snapshot.
#[derive(Clone)]
pub struct WindowCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
    window: usize,
}

impl WindowCache {
    /// An empty cache for a window of `window` positions (at least 1).
    pub fn new(window: usize) -> Self {
        WindowCache {
            keys: None,
            values: None,
            offset: 0,
            window: window.max(1),
        }
    }

    /// Tokens seen (not held: at most `window - 1` are kept).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The window, in positions, each query attends to (itself included).
    pub fn window(&self) -> usize {
        self.window
    }

    /// Appends `keys`/`values` for new positions and returns the kept ones
    /// followed by the new ones; keeps the last `window - 1` of them.
    pub fn update_and_fetch(&mut self, keys: Array, values: Array) -> MlxResult<(Array, Array)> {
        let added = keys.shape()[2] as usize;
        let (k, v) = match (self.keys.take(), self.values.take()) {
            (Some(pk), Some(pv)) => (
                ops::concatenate(&[&pk, &keys], 2)?,
                ops::concatenate(&[&pv, &values], 2)?,
            ),
            _ => (keys, values),
        };
        let total = k.shape()[2] as usize;
        let keep = (self.window - 1).min(total);
        if keep > 0 {
            let from = (total - keep) as i32;
            self.keys = Some(k.index((.., .., from..)));
            self.values = Some(v.index((.., .., from..)));
        }
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
    /// Keys and values of the last positions (sliding-window attention).
    Window(WindowCache),
    /// Convolution inputs and recurrent state (Gated DeltaNet).
    Delta(DeltaCache),
}

impl LayerCache {
    /// The attention cache of a full-attention layer; an error (not a panic)
    /// when an architecture asks a layer for a kind it was not given.
    pub fn kv(&mut self) -> MlxResult<&mut KvCache> {
        match self {
            LayerCache::Kv(c) => Ok(c),
            _ => Err(MlxError::Config(
                "a full-attention layer was given another kind of cache".into(),
            )),
        }
    }

    /// The cache of a sliding-window attention layer.
    pub fn window(&mut self) -> MlxResult<&mut WindowCache> {
        match self {
            LayerCache::Window(c) => Ok(c),
            _ => Err(MlxError::Config(
                "a sliding-window layer was given another kind of cache".into(),
            )),
        }
    }

    /// Arrays to evaluate so that the cache holds computed data.
    pub fn arrays(&self) -> Box<dyn Iterator<Item = &Array> + '_> {
        match self {
            LayerCache::Kv(c) => Box::new(c.arrays()),
            LayerCache::Window(c) => Box::new(c.arrays()),
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
