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

/// The caches of every layer of a model: the engine state after a prefix.
#[derive(Clone, Default)]
pub struct ModelCache {
    pub layers: Vec<KvCache>,
}

impl ModelCache {
    pub fn new(layers: usize) -> Self {
        ModelCache {
            layers: vec![KvCache::default(); layers],
        }
    }

    /// Tokens held (those of the first layer; all layers hold the same).
    pub fn offset(&self) -> usize {
        self.layers.first().map_or(0, KvCache::offset)
    }

    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(KvCache::nbytes).sum()
    }

    /// Evaluates every array so a snapshot holds data, not a pending graph.
    pub fn eval(&self) -> MlxResult<()> {
        let arrays: Vec<&Array> = self.layers.iter().flat_map(KvCache::arrays).collect();
        mlx_rs::transforms::eval(arrays)?;
        Ok(())
    }
}
