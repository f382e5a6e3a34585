//! MLX's memory: what the device can hold, the limits set at start, and
//! the figures exported.
//!
//! At start, before the weights are read:
//! - the weights (the conversion's safetensors bytes; a dequantized CPU
//!   copy is larger, and is not what a GPU holds) must fit in the device's
//!   recommended working set where MLX reports one (a GPU's
//!   `max_recommended_working_set_size`); otherwise the server refuses to
//!   start, naming a conversion that fits;
//! - on a GPU, the wired limit is raised to that working set, so the
//!   weights and the caches stay resident;
//! - MLX's buffer cache (freed buffers kept for reuse) is limited to what
//!   the working set leaves after the weights and the prefix cache's
//!   budget, and at most [`CACHE_CAP`]; where MLX reports no working set
//!   (the CPU), to [`CACHE_CAP`].
//!
//! After each new state's prefill the buffer cache is cleared, so what a
//! request leaves behind is the prefix cache's snapshot, not the prefill's
//! scratch buffers; when the engine's queue empties, a cache over
//! [`IDLE_CACHE`] is cleared too, and the C allocator's free pages are
//! returned when the process holds more than it should idle ([`trim_idle`]). `decisio_mlx_memory_bytes` exports MLX's active, peak
//! and cache bytes after each job ([`export`]; a scoring job's before its
//! answers are sent, so a client that reads `/metrics` once answered sees
//! its request's peak).

use std::ffi::CString;

use super::options::Device;
use crate::metrics::Metrics;

/// The most MLX's buffer cache may hold: a prefill's scratch (activations
/// of a 256-token chunk, attention scores) fits many times over.
pub const CACHE_CAP: usize = 1 << 30;

/// The most of MLX's buffer cache kept while the engine is idle: what the
/// passes of ordinary requests reuse (about 240 to 480 MiB on the fixture,
/// `runs/2026-12-05_memory`); a larger request's leftovers beyond it are
/// given back when its work ends ([`trim_idle`]).
pub const IDLE_CACHE: usize = 512 << 20;

/// What an idle server may hold beyond its resident memory once loaded
/// and its prefix cache's states, before [`trim_idle`] gives the C
/// allocator's free pages back: MLX's idle cache and the host kernels'
/// kept buffers, with room to spare.
pub const IDLE_SLACK: usize = 512 << 20;

/// Called by the engine thread when its queue is empty: clears MLX's
/// buffer cache when it holds more than [`IDLE_CACHE`], and when the
/// process's resident memory is over `loaded` (its resident bytes once
/// the model was loaded) plus the prefix cache's `kept` bytes plus
/// [`IDLE_SLACK`], returns the C allocator's free pages to the system
/// (glibc keeps what MLX freed in its heaps). Ordinary requests leave
/// nothing to return, so they pay for no trim.
pub fn trim_idle(loaded: usize, kept: usize) {
    if mlx_rs::memory::cache_memory().is_ok_and(|b| b > IDLE_CACHE) {
        let _ = mlx_rs::memory::clear_cache();
    }
    if resident_bytes().is_some_and(|r| r > loaded + kept + IDLE_SLACK) {
        release_free_pages();
    }
}

/// The process's resident bytes (Linux: `VmRSS` of `/proc/self/status`);
/// `None` elsewhere.
pub fn resident_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

/// Returns the C allocator's free memory to the system (glibc's
/// `malloc_trim`); nothing where the allocator is not glibc's.
fn release_free_pages() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: `malloc_trim` only gives free pages of the heaps back to
        // the system; it touches no memory in use.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// A size of MLX's device information (`mlx_device_info_get_size`), where
/// MLX has it for this device.
fn device_info_size(device: Device, key: &str) -> Option<usize> {
    let key = CString::new(key).ok()?;
    let kind = match device {
        Device::Cpu => mlx_sys::mlx_device_type__MLX_CPU,
        Device::Gpu => mlx_sys::mlx_device_type__MLX_GPU,
    };
    // SAFETY: the device and the info object are created here, read once
    // and freed; MLX writes `value` only on success.
    unsafe {
        let dev = mlx_sys::mlx_device_new_type(kind, 0);
        let mut info = mlx_sys::mlx_device_info_new();
        let mut value = 0usize;
        let ok = mlx_sys::mlx_device_info_get(&mut info, dev) == 0
            && mlx_sys::mlx_device_info_get_size(&mut value, info, key.as_ptr()) == 0;
        mlx_sys::mlx_device_info_free(info);
        mlx_sys::mlx_device_free(dev);
        ok.then_some(value)
    }
}

/// The bytes MLX recommends a device's working set stays under, where it
/// says (Metal does; the CPU build does not).
pub fn working_set(device: Device) -> Option<usize> {
    device_info_size(device, "max_recommended_working_set_size").filter(|&b| b > 0)
}

/// The limits set at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The device's recommended working set, where known.
    pub working_set: Option<usize>,
    /// The wired limit set (a GPU's only).
    pub wired: Option<usize>,
    /// MLX's buffer-cache limit.
    pub cache: usize,
}

/// The limits for `weights` bytes and a prefix cache of `prefix_cache`
/// bytes on a device whose working set is `working_set`; an error that says
/// what to serve instead when the weights do not fit.
pub fn plan(
    device: Device,
    working_set: Option<usize>,
    weights: usize,
    prefix_cache: usize,
) -> Result<Limits, String> {
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    if let Some(ws) = working_set {
        if weights > ws {
            return Err(format!(
                "the weights ({:.1} GiB) do not fit in this device's working set ({:.1} GiB): \
                 serve a conversion that fits (on a 32 GB Mac, Gemma 4 12B at 6 bits; above \
                 32 GB, Qwen3.6-35B-A3B at 4 bits: docs/running.md)",
                gib(weights),
                gib(ws)
            ));
        }
    }
    let cache = match working_set {
        Some(ws) => ws.saturating_sub(weights + prefix_cache).min(CACHE_CAP),
        None => CACHE_CAP,
    };
    Ok(Limits {
        working_set,
        wired: working_set.filter(|_| device == Device::Gpu),
        cache,
    })
}

/// Sets the limits in MLX.
pub fn apply(limits: &Limits) -> Result<(), mlx_rs::error::Exception> {
    if let Some(w) = limits.wired {
        mlx_rs::memory::set_wired_limit(w)?;
    }
    mlx_rs::memory::set_cache_limit(limits.cache)?;
    Ok(())
}

/// MLX's memory figures as the `decisio_mlx_memory_bytes` gauges.
pub fn export(metrics: &Metrics) {
    use mlx_rs::memory;
    for (kind, bytes) in [
        ("active", memory::active_memory()),
        ("peak", memory::peak_memory()),
        ("cache", memory::cache_memory()),
    ] {
        if let Ok(b) = bytes {
            metrics
                .mlx_memory_bytes
                .with_label_values(&[kind])
                .set(b as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;

    #[test]
    fn weights_over_the_working_set_are_refused() {
        let e = plan(Device::Gpu, Some(21 * GIB), 28 * GIB, 2 * GIB).unwrap_err();
        assert!(e.contains("28.0 GiB") && e.contains("Gemma 4 12B"), "{e}");
    }

    #[test]
    fn the_cache_gets_what_the_working_set_leaves() {
        let l = plan(Device::Gpu, Some(21 * GIB), 17 * GIB, 2 * GIB + GIB / 2).unwrap();
        assert_eq!(l.wired, Some(21 * GIB));
        assert_eq!(l.cache, CACHE_CAP.min(GIB + GIB / 2));
        let l = plan(Device::Gpu, Some(21 * GIB), 19 * GIB, 2 * GIB + GIB / 2).unwrap();
        assert_eq!(l.cache, 0);
        // No working set known (the CPU): the cap, no wired limit.
        let l = plan(Device::Cpu, working_set(Device::Cpu), 20 * GIB, GIB).unwrap();
        assert_eq!((l.wired, l.cache), (None, CACHE_CAP));
    }
}
