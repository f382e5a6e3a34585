//! Where a forward pass spends its time, by class of operation: a profile
//! for the CPU (`examples/cpu_profile.rs`, `scripts/bench/cpu_profile.py`).
//!
//! A profile is of the calling thread: [`start`] turns it on for the
//! thread that calls it (as the example does, which runs the model on its
//! own thread), and no other thread's work is counted. Off (the default),
//! [`op`] is the operation itself and costs one thread-local read. On,
//! each instrumented operation is evaluated where it is
//! built, so its time is its own (its inputs were evaluated by the
//! operations before it), and its seconds and arithmetic are added to its
//! [`Class`]. Evaluating op by op costs what MLX's CPU build costs anyway
//! (it runs a graph op by op, with no fusion), plus one scheduling round
//! per op, which the profile reports as the difference between the
//! instrumented and the plain run.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::Instant;

use mlx_rs::Array;

use super::MlxResult;

/// A class of operation, as the profile reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// The linear layers' matrix products (projections, MLP, output head).
    Products,
    /// Attention's two products (queries by keys, weights by values); on
    /// the float32 host kernels also the softmax between them, which runs
    /// tile by tile on every core with them (`host/workers.rs`).
    AttentionProducts,
    /// Attention's softmax (and its mask) where MLX computes the products.
    Softmax,
    /// RMS norms.
    Norms,
    /// Rotary embeddings.
    Rope,
    /// The MLP's gate (`silu(gate) * up`).
    Activations,
    /// Residual additions, casts, reshapes and slices.
    Residuals,
    /// Appending keys and values to the cache, and copying it.
    Cache,
    /// The token embedding's gather.
    Embedding,
    /// Token ids into MLX, and results out of it.
    Transfers,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Products => "products",
            Class::AttentionProducts => "attention products",
            Class::Softmax => "softmax",
            Class::Norms => "norms",
            Class::Rope => "rope",
            Class::Activations => "activations",
            Class::Residuals => "residuals, casts and reshapes",
            Class::Cache => "cache copies and concatenations",
            Class::Embedding => "embedding",
            Class::Transfers => "host and MLX transfers",
        }
    }
}

/// One class's total.
#[derive(Clone, Debug, Default)]
pub struct Total {
    pub seconds: f64,
    pub flops: f64,
    pub calls: usize,
}

/// A product's shape: `batch` products of `[m, k]` by `[k, n]`; `linear`
/// for a linear layer's, else attention's (batched over the key-value
/// heads); `transposed` when the right operand is stored `[n, k]` (a
/// linear layer's weight, attention's keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Shape {
    pub linear: bool,
    pub transposed: bool,
    pub batch: usize,
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

impl Shape {
    /// `2 batch m k n`.
    pub fn flops(&self) -> f64 {
        2.0 * (self.batch * self.m * self.k) as f64 * self.n as f64
    }
}

/// What a profile gathered.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub classes: BTreeMap<Class, Total>,
    /// The product shapes and their counts.
    pub products: BTreeMap<Shape, usize>,
}

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static PROFILE: RefCell<Profile> = RefCell::new(Profile::default());
}

/// Starts gathering on this thread (anything gathered before is dropped).
pub fn start() {
    PROFILE.with(|p| *p.borrow_mut() = Profile::default());
    ON.with(|on| on.set(true));
}

/// Stops gathering on this thread and returns what was gathered.
pub fn finish() -> Profile {
    ON.with(|on| on.set(false));
    PROFILE.with(|p| std::mem::take(&mut *p.borrow_mut()))
}

/// Whether this thread gathers a profile.
pub fn on() -> bool {
    ON.with(Cell::get)
}

fn record(class: Class, seconds: f64, flops: f64) {
    PROFILE.with(|p| {
        let mut p = p.borrow_mut();
        let t = p.classes.entry(class).or_default();
        t.seconds += seconds;
        t.flops += flops;
        t.calls += 1;
    });
}

/// `f`, and with a profile on, its output evaluated at once and its time
/// and `flops` added to `class`.
pub fn op(class: Class, flops: f64, f: impl FnOnce() -> MlxResult<Array>) -> MlxResult<Array> {
    if !on() {
        return f();
    }
    let started = Instant::now();
    let y = f()?;
    y.eval()?;
    record(class, started.elapsed().as_secs_f64(), flops);
    Ok(y)
}

/// Times host work (`f`) as `class`, with a profile on.
pub fn host<T>(class: Class, flops: f64, f: impl FnOnce() -> T) -> T {
    if !on() {
        return f();
    }
    let started = Instant::now();
    let out = f();
    record(class, started.elapsed().as_secs_f64(), flops);
    out
}

/// A linear layer's product of `x` (`[.., k]`) by a `[n, k]` matrix, for
/// the profile's list of product shapes.
pub fn product(x: &Array, n: usize) {
    let (m, k) = rows(x);
    shape(Shape {
        linear: true,
        transposed: true,
        batch: 1,
        m,
        k,
        n,
    });
}

/// Counts one product of `shape`, with a profile on.
pub fn shape(shape: Shape) {
    if on() {
        PROFILE.with(|p| *p.borrow_mut().products.entry(shape).or_default() += 1);
    }
}

/// The arithmetic of that product, `2 m k n`.
pub fn product_flops(x: &Array, n: usize) -> f64 {
    let (m, k) = rows(x);
    2.0 * m as f64 * k as f64 * n as f64
}

/// `x` as rows: (rows, width).
fn rows(x: &Array) -> (usize, usize) {
    let shape = x.shape();
    let k = shape.last().copied().unwrap_or(1).max(1) as usize;
    ((elements(x) as usize) / k, k)
}

/// The number of elements of `a`, as FLOPs of one operation each.
pub fn elements(a: &Array) -> f64 {
    a.shape().iter().map(|&d| d as f64).product()
}
