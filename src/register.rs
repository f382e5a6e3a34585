//! `decisio register task.json --server URL`: registers a task on a running
//! server, shows the registration's progress as a bar, and prints the
//! fitted figures, over [`crate::client::Client`].
//!
//! `--format csv` (BANKING77's `text,label` with a header) and `--format
//! clinc` (clinc_oos's `{"train": [[text, label], ...], "val": ..., ...}`)
//! read intent data sets as they are published and build the body of an
//! intent task from them and the flags (`--name`, `--question`, ...).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::client::Client;
use crate::progress::Progress;

/// What `decisio register` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The registration body, as `POST /v1/tasks` takes it.
    Json,
    /// `text,label` rows after a header line (BANKING77's CSV files).
    Csv,
    /// clinc_oos's JSON: `[text, label]` pairs under `train`, `val`,
    /// `test`, `oos_train`, ... (`--split` picks the parts).
    Clinc,
}

/// The arguments of `decisio register`.
#[derive(clap::Args)]
pub struct RegisterArgs {
    /// The registration body (JSON), or a data set file (`--format`).
    pub file: PathBuf,
    /// How to read FILE.
    #[arg(long, value_enum, default_value = "json")]
    pub format: Format,
    /// The task's name (`csv`, `clinc`).
    #[arg(long)]
    pub name: Option<String>,
    /// The question each text is asked with (`csv`, `clinc`).
    #[arg(long, default_value = "What does the customer want?")]
    pub question: String,
    /// The clinc_oos parts read, comma-separated.
    #[arg(long, default_value = "train")]
    pub split: String,
    /// Share of the examples held out (`csv`, `clinc`).
    #[arg(long)]
    pub holdout: Option<f64>,
    #[arg(long)]
    pub seed: Option<i64>,
    /// The head's layer (-1: the final norm's output).
    #[arg(long, allow_hyphen_values = true)]
    pub layer: Option<i64>,
    /// Heads fitted on draws of `--shots` examples per label.
    #[arg(long)]
    pub draws: Option<i64>,
    #[arg(long)]
    pub shots: Option<i64>,
    /// Print the registration body built from FILE and exit (nothing is
    /// sent).
    #[arg(long)]
    pub print_body: bool,
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub server: String,
    /// Sent as `Authorization: Bearer <key>`.
    #[arg(long, env = "DECISIO_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Seconds between two looks at the progress.
    #[arg(long, default_value_t = 0.5)]
    pub interval: f64,
}

fn figures_line(label: &str, f: &Value) -> String {
    format!(
        "  {label:<7} T {:>8.4}  accuracy {:.4}  NLL {:.4}  ECE {:.4}",
        f["temperature"].as_f64().unwrap_or(f64::NAN),
        f["accuracy"].as_f64().unwrap_or(f64::NAN),
        f["nll"].as_f64().unwrap_or(f64::NAN),
        f["ece"].as_f64().unwrap_or(f64::NAN),
    )
}

/// (text, label) rows of a CSV file with a header naming `text` and
/// `label` columns (BANKING77's files). Errors name the line.
pub fn read_csv(path: &Path) -> Result<Vec<(String, String)>> {
    let mut reader =
        csv::Reader::from_path(path).with_context(|| format!("cannot read {}", path.display()))?;
    let headers = reader
        .headers()
        .with_context(|| format!("{}: no header line", path.display()))?
        .clone();
    let col = |n: &str| headers.iter().position(|h| h.trim() == n);
    let (Some(t), Some(l)) = (col("text"), col("label")) else {
        bail!(
            "{}: the CSV header must name `text` and `label` columns; got `{}`",
            path.display(),
            headers.iter().collect::<Vec<_>>().join(",")
        );
    };
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = record.with_context(|| format!("{}: not CSV", path.display()))?;
        let line = record.position().map_or(0, |p| p.line());
        match (record.get(t), record.get(l)) {
            (Some(text), Some(label)) => rows.push((text.to_string(), label.trim().to_string())),
            _ => bail!(
                "{} line {line} has {} fields; the header has {}",
                path.display(),
                record.len(),
                headers.len()
            ),
        }
    }
    if rows.is_empty() {
        bail!("{} holds no row", path.display());
    }
    Ok(rows)
}

/// (text, label) pairs of the clinc_oos JSON parts named in `split`.
pub fn read_clinc(text: &str, split: &str) -> Result<Vec<(String, String)>> {
    let v: Value = serde_json::from_str(text).context("the clinc file is not JSON")?;
    let mut rows = Vec::new();
    for part in split.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let items = v[part].as_array().with_context(|| {
            let parts: Vec<&str> = v
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            format!(
                "the clinc file has no part `{part}`; it has {}",
                parts.join(", ")
            )
        })?;
        for (i, item) in items.iter().enumerate() {
            match item.as_array().map(|a| a.as_slice()) {
                Some([Value::String(t), Value::String(l)]) => rows.push((t.clone(), l.clone())),
                _ => bail!("{part}[{i}] is not a [text, label] pair"),
            }
        }
    }
    Ok(rows)
}

/// What an intent registration is made of, besides its examples.
pub struct Intent<'a> {
    pub name: &'a str,
    pub question: &'a str,
    pub holdout: Option<f64>,
    pub seed: Option<i64>,
    pub layer: Option<i64>,
    pub draws: Option<i64>,
    pub shots: Option<i64>,
}

impl Intent<'_> {
    /// The body of the registration from (text, label) rows: the labels
    /// in order of first appearance.
    pub fn body(&self, rows: &[(String, String)]) -> Value {
        let mut labels: Vec<&str> = Vec::new();
        for (_, l) in rows {
            if !labels.contains(&l.as_str()) {
                labels.push(l);
            }
        }
        let examples: Vec<Value> = rows
            .iter()
            .map(|(t, l)| serde_json::json!({"state": t, "label": l}))
            .collect();
        let mut body = serde_json::json!({
            "name": self.name,
            "kind": "intent",
            "question": self.question,
            "labels": labels,
            "examples": examples,
        });
        let o = body.as_object_mut().expect("an object");
        if let Some(h) = self.holdout {
            o.insert("holdout".into(), h.into());
        }
        if let Some(s) = self.seed {
            o.insert("seed".into(), s.into());
        }
        if let Some(l) = self.layer {
            o.insert("head".into(), serde_json::json!({ "layer": l }));
        }
        if let Some(d) = self.draws {
            o.insert("draws".into(), d.into());
        }
        if let Some(s) = self.shots {
            o.insert("shots".into(), s.into());
        }
        body
    }
}

/// The body of an intent registration from (text, label) rows and the
/// flags.
pub fn intent_body(args: &RegisterArgs, rows: &[(String, String)]) -> Result<Value> {
    let name = args
        .name
        .as_deref()
        .context("--name is needed to register a data set file")?;
    Ok(Intent {
        name,
        question: &args.question,
        holdout: args.holdout,
        seed: args.seed,
        layer: args.layer,
        draws: args.draws,
        shots: args.shots,
    }
    .body(rows))
}

/// The registration body FILE gives, as `--format` says.
fn body_of(args: &RegisterArgs) -> Result<Vec<u8>> {
    let raw = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let rows = match args.format {
        Format::Json => return Ok(raw),
        Format::Csv => read_csv(&args.file)?,
        Format::Clinc => read_clinc(&String::from_utf8_lossy(&raw), &args.split)?,
    };
    Ok(serde_json::to_vec(&intent_body(args, &rows)?)?)
}

/// Follows a registration to its end with a progress bar (examples scored,
/// rate, ETA); the task as last seen.
pub fn follow(client: &Client, id: &str, interval: Duration) -> Result<Value> {
    let progress = Progress::new(0, "task");
    loop {
        let reply = client.get(&format!("/v1/tasks/{id}"))?;
        if reply.status != 200 {
            bail!("cannot follow the task {id}: {}", reply.error());
        }
        let task = reply.body;
        let p = &task["progress"];
        let finished = !matches!(task["status"].as_str(), Some("queued" | "running"));
        progress.set_message(format!(
            "task `{}` {}",
            task["name"].as_str().unwrap_or("?"),
            task["status"].as_str().unwrap_or("?")
        ));
        if finished {
            progress.set(
                p["done"].as_u64().unwrap_or(0),
                p["total"].as_u64().unwrap_or(0),
            );
            progress.finish();
            return Ok(task);
        }
        progress.set(
            p["done"].as_u64().unwrap_or(0),
            p["total"].as_u64().unwrap_or(0),
        );
        std::thread::sleep(interval);
    }
}

/// Registers the task, follows it to its end, prints the figures. Fails
/// when the registration is refused, fails or is cancelled.
pub fn run(args: RegisterArgs) -> Result<()> {
    let body = body_of(&args)?;
    if args.print_body {
        std::io::stdout().write_all(&body)?;
        println!();
        return Ok(());
    }
    let client = Client::new(&args.server, args.api_key.clone(), Duration::from_secs(300))?;
    let reply = client.post_raw("/v1/tasks", &body)?;
    if reply.status != 202 {
        bail!("the server refused the registration: {}", reply.error());
    }
    let id = reply.body["id"]
        .as_str()
        .context("the server's reply has no task id")?
        .to_string();
    eprintln!(
        "task `{}` registered as {id}",
        reply.body["name"].as_str().unwrap_or("?")
    );
    let task = follow(
        &client,
        &id,
        Duration::from_secs_f64(args.interval.max(0.05)),
    )?;
    match task["status"].as_str() {
        Some("ready") => {}
        Some("failed") => bail!(
            "the registration failed: {}",
            task["error"].as_str().unwrap_or("no reason given")
        ),
        other => bail!("the registration ended {}", other.unwrap_or("?")),
    }
    let r = &task["result"];
    println!(
        "task `{}` ({id}) ready: T = {:.4}, {} fit and {} holdout examples, {:.1} s",
        task["name"].as_str().unwrap_or("?"),
        r["temperature"].as_f64().unwrap_or(f64::NAN),
        r["fit_examples"],
        r["holdout_examples"],
        r["seconds"].as_f64().unwrap_or(f64::NAN)
    );
    if let Some(h) = r["head"].as_object() {
        println!(
            "intent head: layer {}, C = {}, {} features",
            h["layer"], h["c"], h["dim"]
        );
    }
    println!("holdout figures:");
    println!("{}", figures_line("before", &r["before"]));
    println!("{}", figures_line("after", &r["after"]));
    let d = &r["draws"];
    if d.is_object() {
        println!(
            "{} draws of {} shots per label: accuracy {:.4} ± {:.4}, ECE {:.4} ± {:.4}",
            d["draws"],
            d["shots"],
            d["accuracy_mean"].as_f64().unwrap_or(f64::NAN),
            d["accuracy_sd"].as_f64().unwrap_or(f64::NAN),
            d["ece_mean"].as_f64().unwrap_or(f64::NAN),
            d["ece_sd"].as_f64().unwrap_or(f64::NAN),
        );
    }
    let a = &r["abstention"];
    if a.is_object() {
        match a["abstain_below"].as_f64() {
            Some(t) => println!(
                "abstain below {t:.4}: holdout accuracy {} on {:.1}% answered",
                a["accuracy"]
                    .as_f64()
                    .map_or("-".to_string(), |v| format!("{v:.4}")),
                a["coverage"].as_f64().unwrap_or(0.0) * 100.0
            ),
            None => println!(
                "the target accuracy {} is not reached on the holdout at any threshold",
                a["target_accuracy"]
            ),
        }
    }
    Ok(())
}
