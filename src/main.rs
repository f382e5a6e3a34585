//! The `decisio` command: `serve` a model behind the OpenAI-compatible API,
//! `convert` a GGUF checkpoint into an MLX conversion folder, `register`
//! a task on a running server, or run a `suite` and `gate` its record.
//!
//! Each command is a module of the library (`decisio::serve`,
//! `decisio::convert`, ...) with its arguments and its run function; this
//! file parses the command line and dispatches.

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "decisio",
    version,
    about = "A calibrated decision engine behind an OpenAI-compatible API"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a model over HTTP.
    Serve(Box<decisio::serve::ServeArgs>),
    /// Turn a GGUF checkpoint into an MLX conversion folder.
    Convert(decisio::convert::ConvertArgs),
    /// Register a task on a running server and follow its progress.
    Register(decisio::register::RegisterArgs),
    /// Run a suite through a running server and write its run record.
    #[command(subcommand)]
    Suite(SuiteCommand),
    /// Compare a candidate run record with a reference record, one line per
    /// gate; exits 1 when a gate fails.
    Gate(decisio::suite::gate::GateArgs),
}

#[derive(Subcommand)]
enum SuiteCommand {
    /// Ask a server a suite and write the run record (resumes an
    /// interrupted run in the same --out).
    Run(decisio::suite::run::RunArgs),
}

fn main() -> Result<()> {
    // First, before any other thread or product: OpenBLAS's fast kernels
    // where it does not know the processor (`choose_blas_core`).
    let blas_core = decisio::engine::mlx::host::choose_blas_core();
    // The log goes to standard error: standard output is for what a
    // command prints as its result (`decisio register`'s report).
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,actix_server=warn".into()),
        )
        .init();
    if let Some((fallback, core)) = blas_core {
        tracing::info!(
            "OpenBLAS did not know this processor and took it for `{fallback}`; its `{core}` \
             kernels are used instead (set OPENBLAS_CORETYPE to choose others)"
        );
    }
    match Cli::parse().command {
        Command::Serve(args) => decisio::serve::run(*args),
        Command::Convert(args) => decisio::convert::run(args),
        Command::Register(args) => decisio::register::run(args),
        Command::Suite(SuiteCommand::Run(args)) => {
            let record = decisio::suite::run::run(&args)?;
            println!("{}", record.summary());
            if let Some(t) = record.pooled_temperature() {
                println!("{}", temperature_hint(t, &args.out));
            }
            eprintln!("the record is in {}", args.out.display());
            Ok(())
        }
        Command::Gate(args) => {
            if !decisio::suite::gate::run(&args)? {
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

/// The two `decisio serve` argument lists that make a record's pooled
/// fitted temperature the served default: the value itself, or the record.
fn temperature_serve_args(t: f64, record: &std::path::Path) -> [Vec<String>; 2] {
    [
        vec![
            "serve".into(),
            "--letter-temperature".into(),
            format!("{t:.4}"),
        ],
        vec![
            "serve".into(),
            "--temperature-from".into(),
            record.display().to_string(),
        ],
    ]
}

/// What `decisio suite run` prints after the summary when the record has
/// a pooled fitted temperature.
fn temperature_hint(t: f64, record: &std::path::Path) -> String {
    let [by_value, by_record] = temperature_serve_args(t, record);
    format!(
        "pooled fitted temperature: {t:.4} (to make it the default: decisio {}, or decisio {})",
        by_value.join(" "),
        by_record.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The commands the hint names are ones `decisio serve` takes.
    #[test]
    fn the_temperature_hint_names_flags_serve_takes() {
        let record = std::path::Path::new("records/candidate");
        let hint = temperature_hint(0.8125, record);
        for args in temperature_serve_args(0.8125, record) {
            assert!(hint.contains(&args.join(" ")), "{hint}");
            let argv = std::iter::once("decisio".to_string()).chain(args.iter().cloned());
            if let Err(e) = Cli::try_parse_from(argv) {
                panic!("decisio {} does not parse: {e}", args.join(" "));
            }
        }
        assert!(hint.contains("--letter-temperature 0.8125"), "{hint}");
        assert!(
            hint.contains("--temperature-from records/candidate"),
            "{hint}"
        );
        // The check bites: a flag serve does not have is refused.
        assert!(Cli::try_parse_from(["decisio", "serve", "--temperature", "0.8125"]).is_err());
    }
}
