//! Attention's tiles on every core: the host kernels of
//! [`super::attention`] cut a layer's attention into tiles (rows of
//! queries whose scores fit a core's cache) and hand contiguous runs of
//! them to one thread a core, each tile's products single-threaded
//! `cblas_sgemm` calls and its softmax on the same core between them.
//!
//! OpenBLAS's own threads split each product across the cores, which pays
//! off on a linear layer's large products but not on a tile's (an inner
//! side of 64, the head size, or of 128 keys), and left the softmax
//! between the products on one core: attention ran at about 100 GFLOP/s
//! where the linear products run at 190 on a 2-core machine. Whole tiles a
//! core took a pass of 17 questions' attention to 0.57 of its time
//! (median of 3 paired rounds) and a 3,000-token state's to 0.45
//! (`runs/2026-12-06_attention-cores`).
//!
//! A tile's bits are those of a single-threaded `sgemm` of its shapes,
//! whatever thread runs it and however many threads there are: OpenBLAS is
//! set to one thread for every tile, also where the tiles run on one
//! thread.

use std::sync::OnceLock;

/// One tile of a layer's attention: `rows` output rows from `at` (in
/// units of the head size), over `width` scores a row; `kv` and `from`
/// say which keys and queries it reads, as the kernel lays them out.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tile {
    pub at: usize,
    pub rows: usize,
    pub width: usize,
    pub kv: usize,
    pub from: usize,
}

/// The fewest scores a layer's tiles hold in all before they are spread
/// over the cores: below this a thread's start costs more than it saves
/// (64 Ki scores are about 17 MFLOP of products at a head size of 64,
/// 0.1 ms on one core; a thread starts in about 0.03 ms).
const PARALLEL_SCORES: usize = 1 << 16;

/// OpenBLAS's functions for its thread count, where the process's BLAS is
/// OpenBLAS (found by name, as `cblas_sgemm` is).
struct BlasThreads {
    set: unsafe extern "C" fn(i32),
    get: unsafe extern "C" fn() -> i32,
}

fn blas_threads() -> Option<&'static BlasThreads> {
    static THREADS: OnceLock<Option<BlasThreads>> = OnceLock::new();
    THREADS
        .get_or_init(|| {
            let set = super::symbol(c"openblas_set_num_threads")?;
            let get = super::symbol(c"openblas_get_num_threads")?;
            // SAFETY: OpenBLAS's `void openblas_set_num_threads(int)` and
            // `int openblas_get_num_threads(void)`.
            unsafe {
                Some(BlasThreads {
                    set: std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn(i32)>(set),
                    get: std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn() -> i32>(
                        get,
                    ),
                })
            }
        })
        .as_ref()
}

/// OpenBLAS on one thread while this lives: its thread count before is set
/// back when it drops, also where a tile panics.
struct OneBlasThread(Option<(&'static BlasThreads, i32)>);

impl OneBlasThread {
    fn new() -> Self {
        // SAFETY: OpenBLAS's thread count, read and set from this thread.
        OneBlasThread(blas_threads().map(|b| unsafe {
            let n = (b.get)();
            (b.set)(1);
            (b, n)
        }))
    }
}

impl Drop for OneBlasThread {
    fn drop(&mut self) {
        if let Some((b, n)) = self.0 {
            // SAFETY: as in `new`.
            unsafe { (b.set)(n) };
        }
    }
}

/// The threads the tiles run on: one a core the process may use, where
/// the BLAS is OpenBLAS (whose thread count can be set to one meanwhile);
/// one otherwise, so that a BLAS with threads of its own is not run on
/// top of ours.
fn workers() -> usize {
    static WORKERS: OnceLock<usize> = OnceLock::new();
    *WORKERS.get_or_init(|| match blas_threads() {
        Some(_) => std::thread::available_parallelism().map_or(1, |n| n.get().min(16)),
        None => 1,
    })
}

/// Runs `run(tile, scores, out)` for every tile, in `tiles`' order on
/// each thread: `scores` holds the tile's `rows × width` scores, `out` its
/// `rows × d` output rows. The tiles' rows are consecutive in `out` in
/// the order given (each tile's `at` is the previous one's end), so each
/// thread writes a run of `out` of its own; the runs are cut where the
/// tiles' scores are shared out evenly. `scores` (at least the largest
/// tile's) serves this thread; another thread allocates its own.
///
/// Host kernels run on the engine thread, the one thread that calls MLX,
/// so no product of MLX's runs while OpenBLAS is set to one thread here.
pub(super) fn on_cores(
    tiles: &[Tile],
    d: usize,
    scores: &mut [f32],
    out: &mut [f32],
    run: impl Fn(&Tile, &mut [f32], &mut [f32]) + Sync,
) {
    let Some(first) = tiles.first() else {
        return;
    };
    let total: usize = tiles.iter().map(|t| t.rows * t.width).sum();
    let threads = if total >= PARALLEL_SCORES {
        workers().min(tiles.len())
    } else {
        1
    };
    let _one = OneBlasThread::new();
    let base = first.at;
    let run_part = |part: &[Tile], scores: &mut [f32], out: &mut [f32], from: usize| {
        for t in part {
            let o = &mut out[(t.at - from) * d..][..t.rows * d];
            run(t, &mut scores[..t.rows * t.width], o);
        }
    };
    if threads <= 1 {
        run_part(tiles, scores, &mut out[base * d..], base);
    } else {
        // Contiguous runs of tiles with about equal scores each.
        let mut parts = Vec::with_capacity(threads);
        let (mut start, mut sum) = (0, 0);
        for (i, t) in tiles.iter().enumerate() {
            sum += t.rows * t.width;
            if sum * threads >= total * (parts.len() + 1) && parts.len() + 1 < threads {
                parts.push(&tiles[start..=i]);
                start = i + 1;
            }
        }
        parts.push(&tiles[start..]);
        let largest = tiles.iter().map(|t| t.rows * t.width).max().unwrap_or(0);
        std::thread::scope(|s| {
            let mut rest = &mut out[base * d..];
            let mut mine = None;
            for (i, part) in parts.into_iter().filter(|p| !p.is_empty()).enumerate() {
                let last = part[part.len() - 1];
                let end = last.at + last.rows - part[0].at;
                let (here, after) = std::mem::take(&mut rest).split_at_mut(end * d);
                rest = after;
                let from = part[0].at;
                if i == 0 {
                    mine = Some((part, here, from));
                } else {
                    let run_part = &run_part;
                    s.spawn(move || {
                        let mut scores = vec![0.0f32; largest];
                        run_part(part, &mut scores, here, from);
                    });
                }
            }
            if let Some((part, here, from)) = mine {
                run_part(part, scores, here, from);
            }
        });
    }
}
