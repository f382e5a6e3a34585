//! `decisio convert` as a stand-alone program, until the main binary
//! dispatches to it:
//!
//! ```text
//! cargo run --release --example convert -- --gguf model.gguf --out model-mlx
//! ```

use clap::Parser;
use decisio::convert::{run, ConvertArgs};

/// Convert a llama GGUF checkpoint into an MLX conversion folder.
#[derive(Parser)]
#[command(name = "decisio-convert")]
struct Cli {
    #[command(flatten)]
    args: ConvertArgs,
}

fn main() -> anyhow::Result<()> {
    run(Cli::parse().args)
}
