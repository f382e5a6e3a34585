//! OpenBLAS's kernels for a processor it does not know.
//!
//! MLX's CPU build does its matrix products through the process's BLAS,
//! which on Linux is OpenBLAS (`docs/building.md`). OpenBLAS chooses its
//! kernels by the processor's model number; a release older than the
//! processor (Debian 12's 0.3.21 on a recent Xeon) knows no model and falls
//! back to its `Prescott` kernels (SSE3). Those are several times slower,
//! and their result for one row of a product depends on how many rows the
//! product has: a question read beside others would not be the same bits
//! as read alone. So where OpenBLAS fell back and the processor has the
//! AVX-512 instructions of its `SkylakeX` kernels, those are chosen, as
//! `OPENBLAS_CORETYPE=SkylakeX` would choose them; a core the user names
//! in `OPENBLAS_CORETYPE` is left as named.

use std::ffi::{c_char, CStr};

/// The OpenBLAS core chosen in place of the fallback, and the one it
/// replaced; `None` where nothing was changed (another BLAS, a known
/// processor, a core the user named, or a processor without the
/// instructions). Call it first thing in `main`, before any other thread
/// starts or any product runs: it sets `OPENBLAS_CORETYPE` in the
/// environment and has OpenBLAS choose its kernels again.
pub fn choose_blas_core() -> Option<(String, &'static str)> {
    if std::env::var_os("OPENBLAS_CORETYPE").is_some() {
        return None;
    }
    let corename = super::symbol(c"openblas_get_corename")?;
    let quit = super::symbol(c"gotoblas_dynamic_quit")?;
    let init = super::symbol(c"gotoblas_dynamic_init")?;
    // SAFETY: OpenBLAS's `char *openblas_get_corename(void)`, a static
    // NUL-terminated name.
    let name = unsafe {
        let f = std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn() -> *const c_char>(
            corename,
        );
        CStr::from_ptr(f()).to_string_lossy().into_owned()
    };
    let core = known_core()?;
    if !name.eq_ignore_ascii_case("prescott") {
        return None;
    }
    // SAFETY: run before any other thread exists (the caller's contract),
    // so nothing reads the environment meanwhile, and before any product,
    // so no BLAS call sees OpenBLAS between its `quit` (which forgets the
    // kernels) and its `init` (which chooses them again from
    // `OPENBLAS_CORETYPE`).
    unsafe {
        std::env::set_var("OPENBLAS_CORETYPE", core);
        let quit = std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn()>(quit);
        let init = std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn()>(init);
        quit();
        init();
    }
    Some((name, core))
}

/// OpenBLAS's name for the kernels this processor runs: `SkylakeX` where
/// it has AVX-512 (F, CD, BW, DQ and VL), else none.
fn known_core() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512cd")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl");
        if avx512 {
            return Some("SkylakeX");
        }
    }
    None
}
