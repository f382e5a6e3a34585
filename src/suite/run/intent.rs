//! An intent set of a suite: registered as a task, followed until ready,
//! its heads over draws read back, its holdout asked again as served
//! decisions, and the task deleted.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::bar;
use crate::client::Client;
use crate::suite::data;
use crate::suite::record::{IntentRecord, ServedHoldout};
use crate::suite::{IntentSet, Loaded};

/// A task name for an intent set of this suite.
fn task_name(suite: &str, set: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    };
    format!("suite.{}.{}", clean(suite), clean(set))
}

/// Registers an intent set (or finds its registration from an interrupted
/// run), follows it, reads its heads over draws, and deletes the task.
pub(super) fn intent(client: &Client, loaded: &Loaded, set: &IntentSet) -> Result<IntentRecord> {
    let rows = data::intent_rows(loaded, set)?;
    let name = task_name(&loaded.suite.name, &set.name);
    let reg = crate::register::Intent {
        name: &name,
        question: &set.question,
        holdout: set.holdout,
        seed: Some(loaded.suite.seed as i64),
        layer: set.layer,
        draws: Some(set.draws as i64),
        shots: Some(set.shots as i64),
    };
    let body = reg.body(&rows);
    let labels = body["labels"].as_array().map_or(0, Vec::len);
    let reply = client.post("/v1/tasks", &body)?;
    let id = match reply.status {
        202 => reply.body["id"].as_str().context("no task id")?.to_string(),
        409 if reply.body["error"]["code"] == "task_exists" => {
            let list = client.get("/v1/tasks")?;
            let found = list.body["data"]
                .as_array()
                .and_then(|d| d.iter().find(|t| t["name"] == name.as_str()))
                .with_context(|| format!("the task `{name}` exists but is not listed"))?;
            if found["status"] == "failed" {
                client.delete(&format!("/v1/tasks/{}", found["id"].as_str().unwrap_or("")))?;
                return intent(client, loaded, set);
            }
            eprintln!(
                "intent set `{}`: following the registration `{name}` of an interrupted run",
                set.name
            );
            found["id"].as_str().context("no task id")?.to_string()
        }
        _ => bail!(
            "the server refused the intent set `{}`: {}",
            set.name,
            reply.error()
        ),
    };
    let task = crate::register::follow(client, &id, Duration::from_secs(1))?;
    if task["status"] != "ready" {
        bail!(
            "the intent set `{}` ended {}: {}",
            set.name,
            task["status"],
            task["error"].as_str().unwrap_or("no reason given")
        );
    }
    let r = &task["result"];
    let d = &r["draws"];
    let served = served_holdout(client, &name, &rows, r)?;
    let record = IntentRecord {
        name: set.name.clone(),
        labels,
        examples: rows.len(),
        draws: set.draws,
        shots: set.shots,
        per_draw: serde_json::from_value(d["per_draw"].clone())
            .context("the task's result has no draws")?,
        accuracy_mean: d["accuracy_mean"].as_f64().unwrap_or(f64::NAN),
        accuracy_sd: d["accuracy_sd"].as_f64().unwrap_or(f64::NAN),
        ece_mean: d["ece_mean"].as_f64().unwrap_or(f64::NAN),
        ece_sd: d["ece_sd"].as_f64().unwrap_or(f64::NAN),
        after: serde_json::from_value(r["after"].clone())
            .context("the task's result has no figures")?,
        served,
        result: r.clone(),
    };
    let deleted = client.delete(&format!("/v1/tasks/{id}"))?;
    if deleted.status != 200 {
        eprintln!(
            "warning: the task `{name}` could not be deleted: {}",
            deleted.error()
        );
    }
    Ok(record)
}

/// The task's held-out examples asked again as served decisions, their
/// accuracy and NLL beside the registration's figures at its temperature.
fn served_holdout(
    client: &Client,
    name: &str,
    rows: &[(String, String)],
    result: &Value,
) -> Result<ServedHoldout> {
    let held: Vec<usize> = serde_json::from_value(result["holdout_indices"].clone())
        .context("the task's result has no holdout")?;
    let pb = bar(held.len(), "intent holdout, served");
    let (mut right, mut nll) = (0usize, 0f64);
    for &i in &held {
        let (text, label) = rows.get(i).context("a holdout index beyond the examples")?;
        let reply = client.post(
            "/v1/decide",
            &json!({"state": text, "questions": [{"task": name}]}),
        )?;
        if reply.status != 200 {
            bail!(
                "the server refused a held-out example of `{name}`: {}",
                reply.error()
            );
        }
        let probs = reply.body["answers"][0]["probabilities"]
            .as_object()
            .context("a served intent answer has no probabilities")?;
        let p = probs.get(label).and_then(Value::as_f64).unwrap_or(0.0);
        let best = probs
            .iter()
            .filter_map(|(l, v)| Some((l, v.as_f64()?)))
            .fold(None::<(&String, f64)>, |b, (l, v)| match b {
                Some((_, bv)) if bv >= v => b,
                _ => Some((l, v)),
            });
        if best.is_some_and(|(l, _)| l == label) {
            right += 1;
        }
        nll -= p.max(f64::MIN_POSITIVE).ln();
        pb.inc(1);
    }
    pb.finish();
    let n = held.len().max(1) as f64;
    let (accuracy, nll) = (right as f64 / n, nll / n);
    let after = &result["after"];
    let registration_accuracy = after["accuracy"].as_f64().unwrap_or(f64::NAN);
    let registration_nll = after["nll"].as_f64().unwrap_or(f64::NAN);
    Ok(ServedHoldout {
        questions: held.len(),
        accuracy,
        nll,
        registration_accuracy,
        registration_nll,
        equal: accuracy == registration_accuracy && (nll - registration_nll).abs() <= 1e-6,
    })
}
