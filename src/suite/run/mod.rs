//! `decisio suite run`: asks a server a suite through its public API and
//! writes the run record.
//!
//! Every answer is appended to `OUT/journal.jsonl` as it arrives (a line
//! written whole and flushed), so a run that is interrupted (Ctrl-C,
//! `kill -9`, the server restarting) continues from what it recorded when it
//! is started again with the same `--out`: nothing is asked twice and
//! nothing is lost. A torn last line is dropped. The journal's first line
//! names the suite and the server; a resumption against another suite file
//! or another served configuration is refused.
//!
//! Questions sharing a state go in one `POST /v1/decide` (up to
//! `--questions-per-request`), `--concurrency` requests at a time, each
//! question at temperature 1 so that fitted temperatures are absolute.
//!
//! `journal.rs` keeps the answers as they arrive, `ask.rs` asks the server,
//! `intent.rs` registers the intent sets; this file runs the whole and
//! assembles the record.

mod ask;
mod intent;
mod journal;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use self::ask::{ask, request};
use self::intent::intent;
use self::journal::{read_journal, Journal, Line};
use super::data::{self, Item, State};
use super::record::{
    AnswerRecord, ChoiceRecord, Conformance, IntentRecord, Latency, Quantiles, Record, SetFigures,
    SuiteId, RECORD_FORMAT,
};
use super::{Extra, Loaded};
use crate::client::Client;
use crate::progress::Progress;
use crate::rng::SplitMix;

/// The arguments of `decisio suite run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The suite file (YAML or JSON).
    #[arg(long)]
    pub suite: PathBuf,
    /// The run record's folder (`runs/<date>_<name>/`); an unfinished run
    /// there is resumed.
    #[arg(long)]
    pub out: PathBuf,
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub server: String,
    /// Sent as `Authorization: Bearer <key>`.
    #[arg(long, env = "DECISIO_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// A folder where the suite's data files are looked for (after the
    /// suite file's own folder); may be given more than once.
    #[arg(long)]
    pub data: Vec<PathBuf>,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Questions of one state sent in one request, at most.
    #[arg(long, default_value_t = 32)]
    pub questions_per_request: usize,
    /// Seconds a request may take.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Seconds a request keeps retrying while the server is away (a
    /// restart) or busy (503).
    #[arg(long, default_value_t = 300.0)]
    pub retry_for: f64,
    /// A TrueType font for the plots' text (default: DejaVu Sans or Arial
    /// where installed; no font, no plots).
    #[arg(long)]
    pub font: Option<PathBuf>,
}

fn bar(len: usize, what: &str) -> Progress {
    Progress::new(len as u64, what)
}

/// Memory figures of the server's `/metrics`: the prefix cache's bytes and
/// any gauge whose name says memory.
fn memory(client: &Client) -> Result<Value> {
    let (status, text) = client.text("/metrics")?;
    if status != 200 {
        bail!("GET /metrics answered {status}");
    }
    let mut m = serde_json::Map::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if name.starts_with("decisio_prefix_cache") || name.contains("memory") {
            if let Ok(v) = value.parse::<f64>() {
                m.insert(name.to_string(), v.into());
            }
        }
    }
    Ok(Value::Object(m))
}

/// Runs the suite and writes the record; returns it.
pub fn run(args: &RunArgs) -> Result<Record> {
    let loaded = Loaded::read(&args.suite, &args.data)?;
    let suite = &loaded.suite;
    let client = Client::new(
        &args.server,
        args.api_key.clone(),
        Duration::from_secs_f64(args.timeout),
    )?
    .retry_for(Duration::from_secs_f64(args.retry_for));

    // Every set's data first: a missing file fails before anything is asked.
    let mut sets: Vec<(String, Vec<Item>)> = Vec::new();
    for c in &suite.choice_sets {
        sets.push((c.name.clone(), data::choice_items(&loaded, c)?));
    }
    for i in &suite.intent_sets {
        data::intent_rows(&loaded, i)?;
    }

    let (model, server) = served(&client, &args.server)?;
    let journal_path = args.out.join("journal.jsonl");
    let (journal, old, sessions) = open_journal(args, &loaded, &server, &model)?;

    let mut done: HashSet<(String, String)> = HashSet::new();
    let mut conformed: HashSet<(String, String)> = HashSet::new();
    let mut intents_done: HashSet<String> = HashSet::new();
    for l in &old {
        match l {
            Line::Answer { set, answer, .. } => {
                done.insert((set.clone(), answer.id.clone()));
            }
            Line::Conformance { record, .. } => {
                conformed.insert((record.set.clone(), record.id.clone()));
            }
            Line::Intent { record, .. } => {
                intents_done.insert(record.name.clone());
            }
            Line::Start { .. } => {}
        }
    }

    let work = requests(&sets, &done, args.questions_per_request);
    ask_all(
        &client,
        &model,
        &sets,
        &work,
        (&journal, &journal_path),
        args.concurrency,
    )?;

    conform(
        &client,
        &model,
        (suite.seed, suite.conformance),
        &sets,
        &conformed,
        (&journal, &journal_path),
    )?;

    for set in &suite.intent_sets {
        if intents_done.contains(&set.name) {
            continue;
        }
        eprintln!("intent set `{}`: registering", set.name);
        let record = intent(&client, &loaded, set)?;
        let mut j = journal.lock().expect("journal");
        let t = j.t();
        j.write(&Line::Intent { record, t })?;
    }

    let memory = if suite.record.contains(&Extra::Memory) {
        Some(memory(&client)?)
    } else {
        None
    };
    let record = assemble(
        &loaded,
        &sets,
        &journal_path,
        server,
        model,
        memory,
        sessions as u32,
    )?;
    write(
        &record,
        &args.out,
        super::plot::font(args.font.as_deref()).as_deref(),
    )?;
    Ok(record)
}

/// The served model's name and what it serves (`decisio` of its card in
/// `/v1/models`).
fn served(client: &Client, at: &str) -> Result<(String, Value)> {
    let models = client.get("/v1/models")?;
    if models.status != 200 {
        bail!("GET /v1/models: {}", models.error());
    }
    let card = &models.body["data"][0];
    let model = card["id"]
        .as_str()
        .context("the server names no model")?
        .to_string();
    let server = card["decisio"].clone();
    if !server.is_object() {
        bail!("the server at {} does not describe what it serves (`decisio` of /v1/models): is it a decisio server of this version?", at);
    }
    Ok((model, server))
}

/// The run's journal in `args.out`, resumed where it holds a run of the
/// same suite against the same served configuration (and refused where it
/// holds another), its start written: the journal, its earlier lines and
/// how many sessions they hold.
fn open_journal(
    args: &RunArgs,
    loaded: &Loaded,
    server: &Value,
    model: &str,
) -> Result<(Mutex<Journal>, Vec<Line>, usize)> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let journal_path = args.out.join("journal.jsonl");
    let old = read_journal(&journal_path)?;
    let sessions = old
        .iter()
        .filter(|l| matches!(l, Line::Start { .. }))
        .count();
    if let Some(Line::Start {
        suite: d,
        server: s,
        model: m,
    }) = old.first()
    {
        if *d != loaded.digest {
            bail!(
                "{} holds a run of another suite file (digest {}); give a new --out",
                args.out.display(),
                &d[..12]
            );
        }
        let same = |k: &str| s[k] == server[k];
        if !(same("model_identity")
            && same("tokenizer_identity")
            && same("backend")
            && same("padding")
            && same("default_temperature")
            && *m == model)
        {
            bail!(
                "{} holds a run against another served configuration ({} `{}`, model identity {}); give a new --out",
                args.out.display(),
                s["backend"],
                m,
                s["model_identity"]
            );
        }
        eprintln!(
            "resuming the run in {} ({} lines recorded)",
            args.out.display(),
            old.len()
        );
    }
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&journal_path)?;
    let journal = Mutex::new(Journal {
        file,
        started: Instant::now(),
    });
    journal.lock().expect("journal").write(&Line::Start {
        suite: loaded.digest.clone(),
        server: server.clone(),
        model: model.to_string(),
    })?;
    Ok((journal, old, sessions))
}

/// The requests: the pending questions of each state (`(set, items)`), in
/// chunks of `per_request`; a chat question alone.
fn requests(
    sets: &[(String, Vec<Item>)],
    done: &HashSet<(String, String)>,
    per_request: usize,
) -> Vec<(usize, Vec<usize>)> {
    // The requests: the pending questions of each state, in chunks.
    let mut work: Vec<(usize, Vec<usize>)> = Vec::new();
    for (s, (name, items)) in sets.iter().enumerate() {
        let mut by_state: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        let mut order: Vec<&str> = Vec::new();
        for (i, it) in items.iter().enumerate() {
            if done.contains(&(name.clone(), it.id.clone())) {
                continue;
            }
            let State::Text(state) = &it.state else {
                // A chat question is asked alone.
                work.push((s, vec![i]));
                continue;
            };
            let e = by_state.entry(state).or_default();
            if e.is_empty() {
                order.push(state);
            }
            e.push(i);
        }
        for st in order {
            for chunk in by_state[st].chunks(per_request.max(1)) {
                work.push((s, chunk.to_vec()));
            }
        }
    }
    work
}

/// Asks every request on `concurrency` threads, each answer journalled; the
/// first error stops the run, saying how to resume it.
fn ask_all(
    client: &Client,
    model: &str,
    sets: &[(String, Vec<Item>)],
    work: &[(usize, Vec<usize>)],
    (journal, journal_path): (&Mutex<Journal>, &Path),
    concurrency: usize,
) -> Result<()> {
    let pending: usize = work.iter().map(|(_, c)| c.len()).sum();
    if pending > 0 {
        let pb = bar(pending, "choice questions");
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let first_error: Mutex<Option<anyhow::Error>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..concurrency.max(1) {
                scope.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some((s, idx)) = work.get(k) else { break };
                        let (name, items) = &sets[*s];
                        let chosen: Vec<&Item> = idx.iter().map(|&i| &items[i]).collect();
                        let outcome =
                            ask(client, model, &chosen).and_then(|(answers, ms, cached)| {
                                let mut j = journal.lock().expect("journal");
                                for answer in answers {
                                    let t = j.t();
                                    j.write(&Line::Answer {
                                        set: name.clone(),
                                        answer,
                                        ms,
                                        cached,
                                        t,
                                    })?;
                                }
                                Ok(())
                            });
                        match outcome {
                            Ok(()) => pb.inc(chosen.len() as u64),
                            Err(e) => {
                                stop.store(true, Ordering::Relaxed);
                                first_error.lock().expect("error").get_or_insert(e);
                            }
                        }
                    }
                });
            }
        });
        pb.finish();
        if let Some(e) = first_error.into_inner().expect("error") {
            return Err(e.context(format!(
                "the run stopped; what was answered is in {}: run the same command again to resume",
                journal_path.display()
            )));
        }
    }
    Ok(())
}

/// Conformance: a seeded sample of `conformance` questions of each set,
/// each asked alone again and compared bit for bit with its answer in the
/// journal; what `conformed` holds is not asked again.
fn conform(
    client: &Client,
    model: &str,
    (seed, conformance): (u64, usize),
    sets: &[(String, Vec<Item>)],
    conformed: &HashSet<(String, String)>,
    (journal, journal_path): (&Mutex<Journal>, &Path),
) -> Result<()> {
    // Conformance: a seeded sample of each set, each question alone.
    let mut sample: Vec<(usize, usize)> = Vec::new();
    for (s, (name, items)) in sets.iter().enumerate() {
        let mut idx: Vec<usize> = (0..items.len()).collect();
        let mut rng = SplitMix::new(seed ^ (s as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        rng.shuffle(&mut idx);
        for i in idx.into_iter().take(conformance) {
            if !conformed.contains(&(name.clone(), items[i].id.clone())) {
                sample.push((s, i));
            }
        }
    }
    let answers_now = || -> Result<HashMap<(String, String), AnswerRecord>> {
        Ok(read_journal(journal_path)?
            .into_iter()
            .filter_map(|l| match l {
                Line::Answer { set, answer, .. } => Some(((set, answer.id.clone()), answer)),
                _ => None,
            })
            .collect())
    };
    if !sample.is_empty() {
        let answers = answers_now()?;
        let pb = bar(sample.len(), "conformance");
        for (s, i) in sample {
            let (name, items) = &sets[s];
            let item = &items[i];
            let (mut got, ms, cached) = ask(client, model, &[item])?;
            let got = got.remove(0);
            let suite_answer = answers
                .get(&(name.clone(), item.id.clone()))
                .context("a conformance question has no recorded answer")?;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let equal = bits(&got.probabilities) == bits(&suite_answer.probabilities)
                && bits(&got.letter_logprobs) == bits(&suite_answer.letter_logprobs);
            let (surface, request) = match &item.state {
                State::Text(_) => ("decide", None),
                State::Chat(_) => ("chat", Some(request(model, &[item]).1)),
            };
            let record = Conformance {
                set: name.clone(),
                id: item.id.clone(),
                surface: surface.into(),
                request,
                probabilities: got.probabilities,
                letter_logprobs: got.letter_logprobs,
                equal,
            };
            let mut j = journal.lock().expect("journal");
            let t = j.t();
            j.write(&Line::Conformance {
                record,
                ms,
                cached,
                t,
            })?;
            pb.inc(1);
        }
        pb.finish();
    }
    Ok(())
}

/// The record from the journal.
fn assemble(
    loaded: &Loaded,
    sets: &[(String, Vec<Item>)],
    journal: &Path,
    server: Value,
    model: String,
    memory: Option<Value>,
    resumed: u32,
) -> Result<Record> {
    let lines = read_journal(journal)?;
    let mut answers: HashMap<(String, String), AnswerRecord> = HashMap::new();
    let (mut new_ms, mut cached_ms) = (Vec::new(), Vec::new());
    let mut conformance = Vec::new();
    let mut intents: HashMap<String, IntentRecord> = HashMap::new();
    let mut seconds = 0.0f64;
    let mut session_t = 0.0f64;
    for l in lines {
        match l {
            Line::Start { .. } => {
                seconds += session_t;
                session_t = 0.0;
            }
            Line::Answer {
                set,
                answer,
                ms,
                cached,
                t,
            } => {
                if !cached {
                    new_ms.push(ms);
                }
                session_t = t;
                answers.insert((set, answer.id.clone()), answer);
            }
            Line::Conformance {
                record,
                ms,
                cached,
                t,
            } => {
                if cached {
                    cached_ms.push(ms);
                }
                session_t = t;
                conformance.push(record);
            }
            Line::Intent { record, t } => {
                session_t = t;
                intents.insert(record.name.clone(), record);
            }
        }
    }
    seconds += session_t;
    let suite = &loaded.suite;
    let mut choice_sets = Vec::new();
    for (name, items) in sets {
        let list: Vec<AnswerRecord> = items
            .iter()
            .map(|it| {
                answers
                    .remove(&(name.clone(), it.id.clone()))
                    .with_context(|| format!("no answer recorded for `{}` of `{name}`", it.id))
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&AnswerRecord> = list.iter().collect();
        choice_sets.push(ChoiceRecord {
            name: name.clone(),
            figures: SetFigures::of(&refs),
            answers: list,
        });
    }
    let all: Vec<&AnswerRecord> = choice_sets.iter().flat_map(|c| &c.answers).collect();
    let intent_sets = suite
        .intent_sets
        .iter()
        .map(|s| {
            intents.remove(&s.name).with_context(|| {
                format!("no registration recorded for the intent set `{}`", s.name)
            })
        })
        .collect::<Result<_>>()?;
    Ok(Record {
        format: RECORD_FORMAT.into(),
        suite: SuiteId {
            name: suite.name.clone(),
            version: suite.version,
            digest: loaded.digest.clone(),
            seed: suite.seed,
        },
        server,
        model,
        client_version: env!("CARGO_PKG_VERSION").into(),
        request_settings: json!({
            "temperature": 1.0,
            "multi_question": "the server's default",
            "abstain_below": null,
        }),
        pooled: SetFigures::of(&all),
        choice_sets,
        intent_sets,
        conformance,
        latency: suite.record.contains(&Extra::Latency).then(|| Latency {
            new_state: Quantiles::of(new_ms),
            cached_state: Quantiles::of(cached_ms),
        }),
        memory,
        seconds,
        resumed,
    })
}

/// Writes `record.json`, `summary.md` and the plots into `out`.
pub fn write(record: &Record, out: &Path, font: Option<&Path>) -> Result<()> {
    let mut text = serde_json::to_string_pretty(record)?;
    text.push('\n');
    std::fs::write(out.join("record.json"), text)?;
    let mut md = record.summary();
    match font {
        Some(f) => {
            let files = super::plot::reliability(record, out, f)?;
            md.push_str("\n## Plots\n\n");
            for name in files {
                md.push_str(&format!("![{name}]({name})\n"));
            }
        }
        None => eprintln!("no font found: plots skipped (give one with --font FILE.ttf)"),
    }
    std::fs::write(out.join("summary.md"), md)?;
    Ok(())
}
