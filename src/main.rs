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
    // The log goes to standard error: standard output is for what a
    // command prints as its result (`decisio register`'s report).
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,actix_server=warn".into()),
        )
        .init();
    match Cli::parse().command {
        Command::Serve(args) => decisio::serve::run(*args),
        Command::Convert(args) => decisio::convert::run(args),
        Command::Register(args) => decisio::register::run(args),
        Command::Suite(SuiteCommand::Run(args)) => {
            let record = decisio::suite::run::run(&args)?;
            println!("{}", record.summary());
            if let Some(t) = record.pooled_temperature() {
                println!(
                    "pooled fitted temperature: {t:.4} (serve with --temperature {t:.4} to make it the default)"
                );
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
