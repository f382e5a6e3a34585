//! How a model is held and run: [`LoadOptions`], chosen for the [`Device`]
//! MLX computes on (read at run time, so one build serves a Mac's GPU and a
//! CPU alike), and the engine thread's settings ([`MlxOptions`]).

use std::sync::Arc;

use crate::metrics::Metrics;

/// Token-expert pairs from which quantized experts sort them by expert, as
/// mlx-lm's `SwitchGLU` does (a prefill chunk; a question's few tokens stay
/// unsorted, where sorting costs more than it saves).
pub const SORT_EXPERTS_FROM: usize = 64;

/// How weights are held in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Expand quantized matrices into dense ones at load. MLX's CPU backend
    /// multiplies quantized matrices with a kernel of its own, far slower
    /// than an OpenBLAS product on the dense matrix
    /// (runs/2026-11-30_cpu-kernels), so on the CPU the weights are
    /// dequantized once: the same values, more memory. On Metal quantized
    /// kernels are fast and weights stay quantized.
    pub dequantize: bool,
    /// Compute the softmax of attention, the SiLU gate, the RMS norms and
    /// (llama) the rotary embedding with the host kernels of
    /// [`host`](super::host) instead of MLX's ops. MLX's CPU build evaluates
    /// `exp` one element at a time, which made the first two most of a
    /// question's time, and runs the other two as chains of element-wise
    /// ops; on Metal MLX's own kernels are fast.
    pub host_kernels: bool,
    /// Quantized experts (`gather_qmm`) get their token-expert pairs sorted
    /// by expert from this many pairs on ([`SORT_EXPERTS_FROM`]);
    /// `usize::MAX` never sorts. MLX takes its batched kernel only for
    /// sorted pairs; unsorted, each pair reads its expert's weights again.
    pub sort_experts_from: usize,
    /// Linear attention in MLX ops reads a prompt in blocks of tokens
    /// ([`delta::chunked`](super::delta::chunked)); `false` reads it a token at a time
    /// ([`delta::steps`](super::delta::steps)), as mlx-lm does. Decoding is a token at a time
    /// either way, and the host kernels have their own loop.
    pub chunked_delta: bool,
}

impl Default for LoadOptions {
    /// The choices for the device MLX computes on, read at run time.
    fn default() -> Self {
        LoadOptions::for_device(Device::current())
    }
}

impl LoadOptions {
    /// On the CPU: dequantized weights and the host kernels; on a GPU
    /// (Metal): neither.
    pub fn for_device(device: Device) -> Self {
        let cpu = device == Device::Cpu;
        LoadOptions {
            dequantize: cpu,
            host_kernels: cpu,
            sort_experts_from: SORT_EXPERTS_FROM,
            chunked_delta: true,
        }
    }
}

/// The kind of device MLX computes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Gpu,
}

impl Device {
    /// MLX's default device, asked at run time: a GPU with a Metal build on
    /// a Mac whose GPU MLX can use; the CPU with MLX's CPU build, and with a
    /// Metal build that found no usable GPU.
    pub fn current() -> Device {
        match mlx_rs::Device::try_default().and_then(|d| d.get_type()) {
            Ok(mlx_rs::DeviceType::Gpu) => Device::Gpu,
            _ => Device::Cpu,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_follows_the_device_mlx_computes_on() {
        let cpu = LoadOptions::for_device(Device::Cpu);
        assert!(cpu.dequantize && cpu.host_kernels);
        let gpu = LoadOptions::for_device(Device::Gpu);
        assert!(!gpu.dequantize && !gpu.host_kernels);
        assert_eq!(
            LoadOptions::default(),
            LoadOptions::for_device(Device::current())
        );
        // MLX's CPU build (Linux) has no other device.
        if cfg!(not(target_os = "macos")) {
            assert_eq!(Device::current(), Device::Cpu);
        }
    }
}

/// Settings of the engine thread.
#[derive(Clone, Debug)]
pub struct MlxOptions {
    pub load: LoadOptions,
    /// Budget of the prefix cache in MiB (0 turns it off).
    pub prefix_cache_mib: u64,
    pub metrics: Arc<Metrics>,
    /// Jobs that may wait; one more is refused.
    pub max_queue: usize,
    /// Prompt tokens per forward pass while reading a prompt.
    pub prefill_chunk: usize,
    /// Question tokens per pass on a state, counted as rows times the
    /// longest row ([`crate::settings::Limits::pass_tokens`]).
    pub pass_tokens: usize,
    /// Answers remembered with each cached state.
    pub answers_per_state: usize,
}
