//! Per-layer inference caches, and snapshots of them.
//!
//! MLX arrays are immutable values, so a snapshot of a cache after a prefix
//! is a clone of its handles: continuing from it appends new arrays and never
//! touches the kept ones. That is what lets the prefix cache keep a state and
//! hand it to any number of later questions.
//!
//! A *question cache* ([`ModelCache::for_questions`]) reads many questions
//! on one state in one pass: every row of the pass is a question, and each
//! attention layer keeps the state's keys and values once, shared by every
//! row (batch 1, never copied), beside the rows' own ([`Keys::Split`]);
//! a recurrent layer starts each row from the state's recurrent state.
//! `docs/design/mlx-backend.md`, "One pass for a state's questions", gives
//! the layout.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};

use super::profile::{self, Class};
use super::{MlxError, MlxResult};

/// The keys and values an attention layer's queries attend to
/// (`[batch, kv_heads, tokens, head_dim]`); the queries are the last
/// positions of the keys (of `own` when split).
#[derive(Clone)]
pub enum Keys {
    /// Every position's keys and values.
    Whole(Array, Array),
    /// A question pass: the state's keys and values (batch 1, shared by
    /// every row; `None` for an empty state) and each row's own, which
    /// follow the state's positions.
    Split {
        shared: Option<KeyValues>,
        own: KeyValues,
    },
}

/// A layer's keys and values, `[batch, kv_heads, tokens, head_dim]` each.
pub type KeyValues = (Array, Array);

/// `prev ++ new` along the positions, or `new` alone.
fn append(prev: Option<Array>, new: Array) -> MlxResult<Array> {
    match prev {
        Some(p) => profile::op(Class::Cache, 0.0, || Ok(ops::concatenate(&[&p, &new], 2)?)),
        None => Ok(new),
    }
}

/// Keys and values of one attention layer, `[batch, kv_heads, tokens, head_dim]`.
#[derive(Clone, Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
    /// In a question cache, the state's keys and values; `keys` and
    /// `values` then hold the rows' own.
    shared: Option<KeyValues>,
    questions: bool,
}

impl KvCache {
    /// Tokens held.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// A question cache on this state: its keys shared, none of its own.
    fn for_questions(&self) -> Self {
        KvCache {
            keys: None,
            values: None,
            offset: self.offset,
            shared: self.keys.clone().zip(self.values.clone()),
            questions: true,
        }
    }

    /// A question cache of one row made whole again: the state's keys and
    /// the row's, as a continuation of the state would hold them.
    fn merged(self) -> MlxResult<Self> {
        if !self.questions {
            return Ok(self);
        }
        let (own_k, own_v) = (self.keys, self.values);
        let (keys, values) = match (self.shared, own_k, own_v) {
            (Some((sk, sv)), Some(k), Some(v)) => (append(Some(sk), k)?, append(Some(sv), v)?),
            (Some((sk, sv)), _, _) => (sk, sv),
            (None, k, v) => match (k, v) {
                (Some(k), Some(v)) => (k, v),
                _ => return Ok(KvCache::default()),
            },
        };
        Ok(KvCache {
            keys: Some(keys),
            values: Some(values),
            offset: self.offset,
            shared: None,
            questions: false,
        })
    }

    /// Appends `keys`/`values` for new positions and returns what the new
    /// queries attend to: every position, or in a question cache the
    /// state's and the rows' own.
    pub fn update_and_fetch(&mut self, keys: Array, values: Array) -> MlxResult<Keys> {
        let added = keys.shape()[2] as usize;
        let k = append(self.keys.take(), keys)?;
        let v = append(self.values.take(), values)?;
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        self.offset += added;
        Ok(if self.questions {
            Keys::Split {
                shared: self.shared.clone(),
                own: (k, v),
            }
        } else {
            Keys::Whole(k, v)
        })
    }

    /// Arrays to evaluate so that the cache holds computed data.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys.iter().chain(self.values.iter())
    }

    /// Bytes held (a question cache's own only: the state's are the
    /// state's).
    pub fn nbytes(&self) -> usize {
        self.arrays().map(Array::nbytes).sum()
    }
}

/// Keys and values of one sliding-window attention layer,
/// `[batch, kv_heads, tokens, head_dim]`, laid out position for position as
/// mlx-lm's `RotatingKVCache` lays them out, so that attention sums over
/// the keys in the same order and gives the same bits.
///
/// A query attends to itself and the `window - 1` positions before it.
/// - An update of several positions (a prompt chunk) puts the kept
///   positions in temporal order, keeps the last `window - 1`, appends the
///   new ones and returns all of them; the caller masks each query to its
///   own window. Only the last `window - 1` are kept for the next call
///   (mlx-lm keeps them all until the next update trims them; what each
///   later update computes is the same).
/// - An update of one position (a generated token) returns `window`
///   positions at most, with no mask: until the window is full the new
///   position is appended; after that it overwrites the oldest one in a
///   rotating buffer, so the buffer is in rotated, not temporal, order.
///
/// Arrays are never written in place (an overwrite builds a new array), so
/// a clone is a snapshot.
#[derive(Clone)]
pub struct WindowCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Where the next single position is written once the buffer rotates;
    /// equal to the buffer's length while it is in temporal order.
    idx: usize,
    offset: usize,
    window: usize,
    /// In a question cache: the state's cache and the positions of it the
    /// rows may see (its last `window - 1`, in temporal order); `keys` and
    /// `values` then hold the rows' own, all of them.
    state: Option<Box<(WindowCache, Option<KeyValues>)>>,
}

impl WindowCache {
    /// An empty cache for a window of `window` positions (at least 1).
    pub fn new(window: usize) -> Self {
        WindowCache {
            keys: None,
            values: None,
            idx: 0,
            offset: 0,
            window: window.max(1),
            state: None,
        }
    }

    /// A question cache on this state.
    fn for_questions(&self) -> MlxResult<Self> {
        let visible = match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Some((
                self.last(&self.temporal(k)?, self.window - 1),
                self.last(&self.temporal(v)?, self.window - 1),
            )),
            _ => None,
        };
        Ok(WindowCache {
            keys: None,
            values: None,
            idx: 0,
            offset: self.offset,
            window: self.window,
            state: Some(Box::new((self.clone(), visible))),
        })
    }

    /// A question cache of one row made whole again: the state's cache
    /// continued by the row's positions, as a continuation computes it.
    fn merged(self) -> MlxResult<Self> {
        let Some(state) = self.state else {
            return Ok(self);
        };
        let (mut cache, _) = *state;
        if let (Some(k), Some(v)) = (self.keys, self.values) {
            cache.update_and_fetch(k, v)?;
        }
        Ok(cache)
    }

    /// Tokens seen (not held: at most `window` are kept).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The window, in positions, each query attends to (itself included).
    pub fn window(&self) -> usize {
        self.window
    }

    /// Positions held.
    fn held(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.shape()[2] as usize)
    }

    /// Appends `keys`/`values` for new positions and returns the positions
    /// the new queries attend to (see the type's description for the
    /// layout).
    pub fn update_and_fetch(&mut self, keys: Array, values: Array) -> MlxResult<Keys> {
        let added = keys.shape()[2] as usize;
        if let Some(state) = &self.state {
            let k = append(self.keys.take(), keys)?;
            let v = append(self.values.take(), values)?;
            self.keys = Some(k.clone());
            self.values = Some(v.clone());
            self.offset += added;
            return Ok(Keys::Split {
                shared: state.1.clone(),
                own: (k, v),
            });
        }
        let out = match (self.keys.take(), self.values.take()) {
            (Some(pk), Some(pv)) if added == 1 => self.write_one(pk, pv, keys, values)?,
            (Some(pk), Some(pv)) => {
                let (pk, pv) = (self.temporal(&pk)?, self.temporal(&pv)?);
                let (k, v) = (
                    ops::concatenate(&[&self.last(&pk, self.window - 1), &keys], 2)?,
                    ops::concatenate(&[&self.last(&pv, self.window - 1), &values], 2)?,
                );
                self.keep_last(&k, &v);
                (k, v)
            }
            _ => {
                self.keep_last(&keys, &values);
                (keys, values)
            }
        };
        self.offset += added;
        Ok(Keys::Whole(out.0, out.1))
    }

    /// One new position into a buffer of earlier ones.
    fn write_one(&mut self, pk: Array, pv: Array, k: Array, v: Array) -> MlxResult<(Array, Array)> {
        let held = pk.shape()[2] as usize;
        let (k, v) = if held >= self.window {
            // A full rotating buffer: overwrite the oldest position.
            let at = if self.idx >= self.window { 0 } else { self.idx };
            let put = |buf: &Array, new: &Array| -> MlxResult<Array> {
                let mut parts = Vec::with_capacity(3);
                if at > 0 {
                    parts.push(buf.index((.., .., ..at as i32)));
                }
                parts.push(new.clone());
                if at + 1 < held {
                    parts.push(buf.index((.., .., (at + 1) as i32..)));
                }
                Ok(ops::concatenate(&parts, 2)?)
            };
            let out = (put(&pk, &k)?, put(&pv, &v)?);
            self.idx = at + 1;
            out
        } else if self.offset >= self.window {
            // The last `window - 1` positions in temporal order, the oldest
            // position of the window already dropped: the new one takes its
            // place, at the buffer's start.
            self.idx = 1;
            (
                ops::concatenate(&[&k, &pk], 2)?,
                ops::concatenate(&[&v, &pv], 2)?,
            )
        } else {
            self.idx = held + 1;
            (
                ops::concatenate(&[&pk, &k], 2)?,
                ops::concatenate(&[&pv, &v], 2)?,
            )
        };
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        Ok((k, v))
    }

    /// The buffer in temporal order.
    fn temporal(&self, buf: &Array) -> MlxResult<Array> {
        let held = buf.shape()[2] as usize;
        if self.idx >= held {
            return Ok(buf.clone());
        }
        let at = self.idx as i32;
        Ok(ops::concatenate(
            &[buf.index((.., .., at..)), buf.index((.., .., ..at))],
            2,
        )?)
    }

    /// The last `n` positions of a buffer in temporal order.
    fn last(&self, buf: &Array, n: usize) -> Array {
        let held = buf.shape()[2] as usize;
        if held <= n {
            return buf.clone();
        }
        buf.index((.., .., (held - n) as i32..))
    }

    /// Keeps the last `window - 1` positions of `k`/`v` (temporal order).
    fn keep_last(&mut self, k: &Array, v: &Array) {
        let n = self.window - 1;
        self.keys = Some(self.last(k, n));
        self.values = Some(self.last(v, n));
        self.idx = self.held();
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
    /// `rows` copies of this state, one per row of a question pass.
    fn for_questions(&self, rows: i32) -> MlxResult<Self> {
        let tile = |a: &Array| -> MlxResult<Array> {
            if rows == 1 {
                return Ok(a.clone());
            }
            let mut reps = vec![1; a.ndim()];
            reps[0] = rows;
            Ok(ops::tile(a, &reps)?)
        };
        Ok(DeltaCache {
            conv: self.conv.as_ref().map(tile).transpose()?,
            state: self.state.as_ref().map(tile).transpose()?,
        })
    }

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

    /// A question cache on this state for a pass of `rows` rows: every
    /// row continues the state from its position, attention layers share
    /// the state's keys and values (never copied), recurrent layers give
    /// each row the state's recurrent state.
    pub fn for_questions(&self, rows: usize) -> MlxResult<Self> {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(match l {
                    LayerCache::Kv(c) => LayerCache::Kv(c.for_questions()),
                    LayerCache::Window(c) => LayerCache::Window(c.for_questions()?),
                    LayerCache::Delta(c) => LayerCache::Delta(c.for_questions(rows as i32)?),
                })
            })
            .collect::<MlxResult<Vec<_>>>()?;
        Ok(ModelCache {
            layers,
            offset: self.offset,
        })
    }

    /// A question cache of one row made whole again, so that generation
    /// continues from it as from a prefilled prompt.
    pub fn merged(self) -> MlxResult<Self> {
        let layers = self
            .layers
            .into_iter()
            .map(|l| {
                Ok(match l {
                    LayerCache::Kv(c) => LayerCache::Kv(c.merged()?),
                    LayerCache::Window(c) => LayerCache::Window(c.merged()?),
                    d @ LayerCache::Delta(_) => d,
                })
            })
            .collect::<MlxResult<Vec<_>>>()?;
        Ok(ModelCache {
            layers,
            offset: self.offset,
        })
    }

    /// Evaluates every array so a snapshot holds data, not a pending graph.
    pub fn eval(&self) -> MlxResult<()> {
        let arrays: Vec<&Array> = self.layers.iter().flat_map(LayerCache::arrays).collect();
        mlx_rs::transforms::eval(arrays)?;
        Ok(())
    }
}
