//! `decisio register task.json --server URL`: registers a task on a running
//! server, shows the registration's progress as a bar, and prints the
//! fitted figures. A plain HTTP/1.1 client over a TCP stream (`http://`
//! only: the server speaks plain HTTP).
//!
//! `--format csv` (BANKING77's `text,label` with a header) and `--format
//! clinc` (clinc_oos's `{"train": [[text, label], ...], "val": ..., ...}`)
//! read intent data sets as they are published and build the body of an
//! intent task from them and the flags (`--name`, `--question`, ...).

use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

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

struct Reply {
    status: u16,
    body: Value,
}

/// `host:port` of an `http://` URL.
fn authority(url: &str) -> Result<String> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("--server must be an http:// URL; got `{url}`"))?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        bail!("--server `{url}` names no host");
    }
    Ok(if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:80")
    })
}

fn request(
    addr: &str,
    key: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> Result<Reply> {
    let mut stream =
        TcpStream::connect(addr).with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(k) = key {
        head.push_str(&format!("Authorization: Bearer {k}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if let Some(b) = body {
        // The server may answer (413) before reading it all.
        let _ = stream.write_all(b);
    }
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP reply from {addr}: `{}`", line.trim()))?;
    let mut chunked = false;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let lower = h.to_ascii_lowercase();
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
    let mut raw = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            let mut chunk = vec![0; n + 2];
            reader.read_exact(&mut chunk)?;
            raw.extend_from_slice(&chunk[..n]);
        }
    } else {
        reader.read_to_end(&mut raw)?;
    }
    let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    Ok(Reply { status, body })
}

fn error_of(reply: &Reply) -> String {
    let e = &reply.body["error"];
    match (e["message"].as_str(), e["param"].as_str()) {
        (Some(m), Some(p)) => format!("{} ({p}): {m}", reply.status),
        (Some(m), None) => format!("{}: {m}", reply.status),
        _ => format!("HTTP {}", reply.status),
    }
}

/// One line of progress: a bar, done of total, rate, ETA.
fn bar(task: &Value, width: usize) -> String {
    let p = &task["progress"];
    let done = p["done"].as_u64().unwrap_or(0);
    let total = p["total"].as_u64().unwrap_or(0).max(1);
    let filled = (done as usize * width) / total as usize;
    let rate = p["rate"]
        .as_f64()
        .map_or("-".to_string(), |r| format!("{r:.2}/s"));
    let eta = p["eta_seconds"]
        .as_f64()
        .map_or("-".to_string(), |s| format!("{:.0}s", s.ceil()));
    format!(
        "[{}{}] {done}/{total} {} {rate} ETA {eta}",
        "#".repeat(filled),
        ".".repeat(width - filled),
        task["status"].as_str().unwrap_or("?"),
    )
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

/// Fields of a CSV line: commas split, double quotes quote (`""` is a
/// quote inside a quoted field).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        let field = fields.last_mut().expect("one field");
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            ('"', true) => quoted = false,
            ('"', false) if field.is_empty() => quoted = true,
            (',', false) => fields.push(String::new()),
            (c, _) => field.push(c),
        }
    }
    fields
}

/// (text, label) rows of a `text,label` CSV file with a header. A quoted
/// text may span lines.
pub fn read_csv(text: &str) -> Result<Vec<(String, String)>> {
    let mut records: Vec<String> = Vec::new();
    let mut open = String::new();
    for line in text.lines() {
        if !open.is_empty() {
            open.push('\n');
        }
        open.push_str(line);
        // A record ends where its quotes balance.
        if open.matches('"').count().is_multiple_of(2) {
            records.push(std::mem::take(&mut open));
        }
    }
    if !open.is_empty() {
        bail!("the CSV file ends inside a quoted field");
    }
    let mut rows = records.into_iter().filter(|r| !r.trim().is_empty());
    let header = rows.next().context("the CSV file is empty")?;
    let names = csv_fields(&header);
    let col = |n: &str| names.iter().position(|h| h.trim() == n);
    let (Some(t), Some(l)) = (col("text"), col("label")) else {
        bail!("the CSV header must name `text` and `label` columns; got `{header}`");
    };
    rows.enumerate()
        .map(|(i, r)| {
            let f = csv_fields(&r);
            match (f.get(t), f.get(l)) {
                (Some(text), Some(label)) => Ok((text.clone(), label.trim().to_string())),
                _ => bail!(
                    "CSV line {} has {} fields; the header has {}",
                    i + 2,
                    f.len(),
                    names.len()
                ),
            }
        })
        .collect()
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

/// The body of an intent registration from (text, label) rows: the labels
/// in order of first appearance.
pub fn intent_body(args: &RegisterArgs, rows: &[(String, String)]) -> Result<Value> {
    let name = args
        .name
        .as_deref()
        .context("--name is needed to register a data set file")?;
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
        "name": name,
        "kind": "intent",
        "question": args.question,
        "labels": labels,
        "examples": examples,
    });
    let o = body.as_object_mut().expect("an object");
    if let Some(h) = args.holdout {
        o.insert("holdout".into(), h.into());
    }
    if let Some(s) = args.seed {
        o.insert("seed".into(), s.into());
    }
    if let Some(l) = args.layer {
        o.insert("head".into(), serde_json::json!({ "layer": l }));
    }
    if let Some(d) = args.draws {
        o.insert("draws".into(), d.into());
    }
    if let Some(s) = args.shots {
        o.insert("shots".into(), s.into());
    }
    Ok(body)
}

/// The registration body FILE gives, as `--format` says.
fn body_of(args: &RegisterArgs) -> Result<Vec<u8>> {
    let raw = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let rows = match args.format {
        Format::Json => return Ok(raw),
        Format::Csv => read_csv(&String::from_utf8_lossy(&raw))?,
        Format::Clinc => read_clinc(&String::from_utf8_lossy(&raw), &args.split)?,
    };
    Ok(serde_json::to_vec(&intent_body(args, &rows)?)?)
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
    let addr = authority(&args.server)?;
    let key = args.api_key.as_deref();
    let reply = request(&addr, key, "POST", "/v1/tasks", Some(&body))?;
    if reply.status != 202 {
        bail!("the server refused the registration: {}", error_of(&reply));
    }
    let id = reply.body["id"]
        .as_str()
        .context("the server's reply has no task id")?
        .to_string();
    eprintln!(
        "task `{}` registered as {id}",
        reply.body["name"].as_str().unwrap_or("?")
    );
    let tty = std::io::stderr().is_terminal();
    let mut last_line = Instant::now();
    let task = loop {
        let reply = request(&addr, key, "GET", &format!("/v1/tasks/{id}"), None)?;
        if reply.status != 200 {
            bail!("cannot follow the task: {}", error_of(&reply));
        }
        let status = reply.body["status"].as_str().unwrap_or("").to_string();
        let finished = !matches!(status.as_str(), "queued" | "running");
        if tty {
            eprint!("\r{}\x1b[K", bar(&reply.body, 30));
        } else if finished || last_line.elapsed() >= Duration::from_secs(10) {
            last_line = Instant::now();
            eprintln!("{}", bar(&reply.body, 30));
        }
        if finished {
            if tty {
                eprintln!();
            }
            break reply.body;
        }
        std::thread::sleep(Duration::from_secs_f64(args.interval.max(0.05)));
    };
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
