//! The bases' settings and refusals, through real `decisio serve` processes:
//! every refusal is a start-up error (or an HTTP error) that says what to do
//! instead, given before any weight is read.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Runs `decisio serve` with `args` (and `env`) and returns its exit status
/// and standard error, failing the test if it is still running after 60 s.
fn serve_fails(args: &[&str], env: &[(&str, &Path)]) -> String {
    let state = common::fresh_dir("bases-state");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_decisio"));
    cmd.arg("serve")
        .args(args)
        .args(["--port", "0"])
        .arg("--state-dir")
        .arg(&state)
        .env("HF_HUB_OFFLINE", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start decisio serve");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            assert!(!status.success(), "decisio serve {args:?} started: {err}");
            return err;
        }
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().ok();
            panic!("decisio serve {args:?} neither failed nor stopped within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A conversion folder holding only `config` (refusals come before weights).
fn config_only(name: &str, config: &Value) -> PathBuf {
    let dir = common::fresh_dir(name);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

/// A Hugging Face cache (`HF_HOME`) holding `repo` with only `config`, in
/// the hub's layout (refs/main naming a snapshot folder).
fn hub_with_config(name: &str, repo: &str, config: &Value) -> PathBuf {
    let home = common::fresh_dir(name);
    let folder = home
        .join("hub")
        .join(format!("models--{}", repo.replace('/', "--")));
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let snapshot = folder.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(folder.join("refs")).unwrap();
    std::fs::write(folder.join("refs/main"), commit).unwrap();
    std::fs::write(snapshot.join("config.json"), config.to_string()).unwrap();
    home
}

fn fp8_config() -> Value {
    json!({"model_type": "qwen3_5_moe", "num_hidden_layers": 40,
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                   "weight_block_size": [128, 128]}})
}

#[test]
fn an_fp8_checkpoint_is_refused_by_model_and_by_base() {
    let dir = config_only("fp8-model", &fp8_config());
    let err = serve_fails(&["--model", dir.to_str().unwrap()], &[]);
    assert!(
        err.contains("FP8") && err.contains("--model mlx-community/Qwen3.6-35B-A3B-6bit"),
        "{err}"
    );

    let repo = "Qwen/Qwen3.6-35B-A3B-FP8";
    let home = hub_with_config("fp8-hub", repo, &fp8_config());
    let fixture = common::model_dir();
    let err = serve_fails(
        &["--base", repo, "--model", fixture.to_str().unwrap()],
        &[("HF_HOME", &home)],
    );
    assert!(
        err.contains(&format!("--base `{repo}`")) && err.contains("FP8"),
        "{err}"
    );
}

#[test]
fn conversions_that_are_not_shipped_are_refused() {
    let qwen8 = json!({"model_type": "qwen3_5_moe", "text_config": {"num_hidden_layers": 40},
                       "quantization": {"group_size": 64, "bits": 8}});
    let dir = config_only("qwen-8bit", &qwen8);
    let err = serve_fails(&["--model", dir.to_str().unwrap()], &[]);
    assert!(
        err.contains("8-bit conversion is not shipped")
            && err.contains("mlx-community/Qwen3.6-35B-A3B-6bit"),
        "{err}"
    );

    let repo = "mlx-community/gemma-4-12B-it-4bit";
    let gemma4 = json!({"model_type": "gemma4", "text_config": {
        "model_type": "gemma4_text", "num_hidden_layers": 48},
        "quantization": {"group_size": 64, "bits": 4}});
    let home = hub_with_config("gemma-4bit", repo, &gemma4);
    let err = serve_fails(
        &["--base", "gemma-4-12b", "--model", repo],
        &[("HF_HOME", &home)],
    );
    assert!(
        err.contains("suite-accuracy gate") && err.contains("gemma-4-12B-it-6bit"),
        "{err}"
    );
}

#[test]
fn an_unknown_base_lists_the_bases() {
    let fixture = common::model_dir();
    let err = serve_fails(
        &["--base", "gemma-5", "--model", fixture.to_str().unwrap()],
        &[],
    );
    assert!(
        err.contains("qwen3.6-35b-a3b, gemma-4-12b, gemma-4-31b, custom"),
        "{err}"
    );
    // A conversion of a base's architecture but of none of its sizes.
    let odd = json!({"model_type": "gemma4", "text_config": {
        "model_type": "gemma4_text", "num_hidden_layers": 7}});
    let dir = config_only("gemma-odd", &odd);
    let err = serve_fails(&["--model", dir.to_str().unwrap()], &[]);
    assert!(
        err.contains("none of the bases") && err.contains("--base custom"),
        "{err}"
    );
}

#[test]
fn a_base_without_its_tokenizer_says_how_to_get_it() {
    // The base's official tokenizer is pinned; offline and not cached, the
    // error names it and the override.
    let fixture = common::model_dir();
    let home = common::fresh_dir("empty-hub");
    let err = serve_fails(
        &[
            "--base",
            "gemma-4-31b",
            "--model",
            fixture.to_str().unwrap(),
        ],
        &[("HF_HOME", &home)],
    );
    assert!(
        err.contains("google/gemma-4-31B-it@419b2efe421994fdfd3394e621983d4cc511cd4f")
            && err.contains("--tokenizer"),
        "{err}"
    );
}

#[test]
fn lora_adapters_and_a_second_engine_head_are_refused() {
    let fixture = common::model_dir();
    let err = serve_fails(
        &[
            "--model",
            fixture.to_str().unwrap(),
            "--lora",
            "adapters/intent",
        ],
        &[],
    );
    assert!(
        err.contains("LoRA adapters are not served") && err.contains("--model"),
        "{err}"
    );
    let err = serve_fails(
        &[
            "--model",
            fixture.to_str().unwrap(),
            "--head-upstream",
            "http://127.0.0.1:9",
        ],
        &[],
    );
    assert!(
        err.contains("second-engine head") && err.contains("--backend vllm"),
        "{err}"
    );
}

#[test]
fn a_request_naming_an_adapter_is_refused_and_the_base_settings_apply() {
    // The fixture served with a base's settings (its tokenizer overridden):
    // the base's prefix-cache budget applies, and a request naming a LoRA
    // adapter as its model is a 404 that says adapters are not served.
    let fixture = common::model_dir();
    let server = common::Server::start(&[
        "--base",
        "gemma-4-12b",
        "--tokenizer",
        fixture.to_str().unwrap(),
    ]);
    let metrics = server.request("GET", "/metrics", &[], None).unwrap().text();
    let budget = metrics
        .lines()
        .find(|l| l.starts_with("decisio_prefix_cache_capacity_bytes"))
        .unwrap_or_else(|| panic!("no prefix-cache capacity metric in:\n{metrics}"));
    assert!(budget.ends_with(&format!("{}", 7400u64 << 20)), "{budget}");
    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"model": "my-lora-adapter", "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    let e = r.json()["error"].clone();
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("LoRA adapters are not served"),
        "{e}"
    );
}
