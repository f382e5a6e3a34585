//! The size of an MLX computation: how many ops the lazy graph behind some
//! arrays holds, counted from MLX's own `print_graph`. Tests and benchmarks
//! use it to show that a formulation launches a bounded number of ops (on
//! Metal, each op is at least one kernel launch).

use std::ffi::CString;

use mlx_rs::Array;

/// Ops in the graph that computes `outputs` (not yet evaluated): one per
/// op node MLX prints, inputs and constants not counted.
pub fn op_count(outputs: &[&Array]) -> std::io::Result<usize> {
    let path = std::env::temp_dir().join(format!(
        "decisio-graph-{}-{:?}.txt",
        std::process::id(),
        std::thread::current().id()
    ));
    let c_path = CString::new(path.to_string_lossy().as_bytes())?;
    let mode = CString::new("w")?;
    // SAFETY: the file, the vector and the namer are created here, used
    // only by MLX's call, and freed before returning; the arrays outlive
    // the call.
    let status = unsafe {
        let file = mlx_sys::fopen(c_path.as_ptr(), mode.as_ptr());
        if file.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        let vec = mlx_sys::mlx_vector_array_new();
        for a in outputs {
            mlx_sys::mlx_vector_array_append_value(vec, a.as_ptr());
        }
        let namer = mlx_sys::mlx_node_namer_new();
        let status = mlx_sys::mlx_print_graph(file, namer, vec);
        mlx_sys::mlx_node_namer_free(namer);
        mlx_sys::mlx_vector_array_free(vec);
        mlx_sys::fclose(file);
        status
    };
    let text = std::fs::read_to_string(&path);
    let _ = std::fs::remove_file(&path);
    if status != 0 {
        return Err(std::io::Error::other("MLX could not print the graph"));
    }
    Ok(count_ops(&text?))
}

/// MLX prints a graph as its inputs, then one line per op node (`Name
/// inputs -> outputs`).
fn count_ops(text: &str) -> usize {
    text.lines().filter(|l| l.contains(" -> ")).count()
}
